"""What a running job reports: per-epoch metrics, their display, and the Prometheus endpoint."""

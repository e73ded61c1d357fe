"""`type: delta`: a Delta Lake table committed from the driver with delta-rs."""

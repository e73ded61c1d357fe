"""Sources and sinks. One contract each in `base.py`; one module per implementation."""

"""The quality job: sampling-weighted quality estimates and drift against a baseline (pure core in ``core.py``)."""

"""The detect job: streaming anomaly detection and cross-region incidents (pure core in ``core.py``)."""

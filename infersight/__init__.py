"""infersight: streaming observability and anomaly detection for multi-region LLM inference.

Components install as ``infersight.<component>``: ``schemas``, ``instrumentation``,
``collectors``, ``flink_jobs``, ``dashboards`` and ``stack`` (the native local stack).
"""

__version__ = "0.1.0"

"""What every job shares: event-time window arithmetic (``windows``), key encoding (``keys``), the Kafka
sources and sinks (``kafka_io``), the execution environment (``environment``) and the binning of the
every-request drift signals (``request_signals``: the metrics job publishes them, the quality job reads them)."""

"""What every job shares: event-time window arithmetic (``windows``), key encoding (``keys``), the Kafka
sources and sinks (``kafka_io``) and the execution environment (``environment``)."""

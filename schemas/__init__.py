"""The telemetry contract: attribute names, Kafka topics and record schemas, owned in one place."""

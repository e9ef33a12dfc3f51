"""The archive job: request records -> Parquet, Hive-partitioned by UTC day and region. ``core`` (pure: schema,
bucketing, idempotent bucket writes, reading the archive back), ``functions`` (Flink), ``job`` (wiring)."""

"""The normalize job: request-level OTLP spans -> ``infersight.requests``, pod OTLP metrics ->
``infersight.pods``, the rest -> ``infersight.dlq``. ``core`` (pure), ``functions`` (Flink), ``job`` (wiring);
``otlp_spans``, ``span_records`` and ``pod_gauges`` decode the OTLP payloads."""

"""Test-only helpers shared by the tests and the benchmarks: synthetic request records, their OTLP
encoding, a minimal Flink job (``span_tap``) for the first-slice test, and an OTLP/gRPC receiver
(``otlp_sink``) for tests and benchmarks that need an endpoint without the stack."""

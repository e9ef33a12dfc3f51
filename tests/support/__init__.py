"""Test-only helpers shared by the tests and the benchmarks: synthetic request records, their OTLP
encoding, and a minimal Flink job (``span_tap``) for the first-slice test."""

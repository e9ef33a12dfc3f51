"""The fleet simulator: a virtual multi-region fleet of LLM serving pods that emits OTLP telemetry exactly
as ``infersight.instrumentation`` does (request root spans, stage spans of sampled traces, pod gauges),
at up to tens of thousands of requests per second, deterministic for a seed.

``infersight simulate`` runs it against the local stack's regional gateways; ``infersight demo`` adds
the stack, the jobs and a live terminal view. Faults are timelines of perturbations (``fleet.Perturbation``).
"""

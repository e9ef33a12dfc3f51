"""Evaluators beside serving (the ``evaluators`` extra): a sampler and a background worker with a bounded
queue hand finished requests to guardrail checks, an embedding judge and an LLM judge; each result becomes a
``gen_ai.evaluation.result`` event of the request's trace, carrying its sample rate."""

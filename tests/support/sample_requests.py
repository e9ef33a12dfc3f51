"""Deterministic synthetic request records (a seed gives the same records) for the jobs' tests and
benchmark: lognormal latencies per region, heavy-tailed output lengths, some errors."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from infersight.schemas.records import RequestRecord
from infersight.schemas.units import NS

REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-1")
MODELS = ("llama-3-8b", "mistral-7b")


def sample_records(n: int, start_ns: int, span_s: float, seed: int = 7, regions: Sequence[str] = REGIONS,
                   models: Sequence[str] = MODELS, error_rate: float = 0.02,
                   slow_region: str | None = None) -> Iterator[RequestRecord]:
    """``n`` requests ending uniformly in ``[start_ns, start_ns + span_s)``; ``slow_region`` has a TTFT
    distribution 5x slower (what makes averaging regional p99s wrong)."""
    rng = random.Random(seed)
    for _ in range(n):
        region = rng.choice(regions)
        model = rng.choice(models)
        end = start_ns + int(rng.random() * span_s * NS)
        scale = 5.0 if region == slow_region else 1.0
        queue = rng.lognormvariate(-5.5, 1.0) * scale
        ttft = queue + rng.lognormvariate(-3.0, 0.6) * scale
        tokens_out = max(1, min(4096, int(rng.paretovariate(1.3) * 40)))
        tpot = rng.lognormvariate(-4.0, 0.3)
        decode = tpot * (tokens_out - 1)
        e2e = ttft + decode
        error = "timeout" if rng.random() < error_rate else None
        tokens_in = rng.randint(16, 2048)
        trace_id = rng.getrandbits(128).to_bytes(16, "big").hex()
        yield RequestRecord(
            trace_id=trace_id, span_id=trace_id[:16], region=region, model=model,
            start_ns=end - int(e2e * NS) - 1, end_ns=end, e2e_s=e2e, model_version="v1",
            track="canary" if rng.random() < 0.1 else "stable", engine="vllm", ttft_s=ttft, queue_s=queue,
            prefill_s=ttft - queue, decode_s=decode, itl_count=tokens_out - 1,
            itl_mean_s=tpot if tokens_out > 1 else None, itl_p50_s=tpot if tokens_out > 1 else None,
            itl_p90_s=tpot * 1.2 if tokens_out > 1 else None, itl_p99_s=tpot * 1.5 if tokens_out > 1 else None,
            itl_max_s=tpot * 2 if tokens_out > 1 else None, tokens_in=tokens_in, tokens_out=tokens_out,
            tokens_cached=rng.randint(0, tokens_in // 2), finish_reason="error" if error else "stop",
            error_type=error)

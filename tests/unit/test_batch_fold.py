"""``LabelLimiter.batch_fold`` (one message's records at one ``now_ms``, the quality job's reader) folds exactly as
``fold`` record by record: the same records out, the same per-label folded counts and the same admitted values
and last-seen times, with bounds reached, stale values freed between batches, and repeats within a batch."""

from __future__ import annotations

import random

import pytest

from infersight.flink_jobs.common.cardinality import LabelLimiter
from infersight.flink_jobs.quality.stream import LABELS


def test_batch_fold_is_fold_record_by_record():
    rng = random.Random(4)
    limits = {"region": 3, "model": 5, "model_version": 4, "track": 2, "evaluator": 3}
    one, batched = LabelLimiter(limits, 1000, LABELS), LabelLimiter(limits, 1000, LABELS)
    now_ms = 0
    for _ in range(60):
        now_ms += rng.choice([10, 400, 1500])  # some batches past the span: slots free up
        fold = batched.batch_fold(now_ms)
        for _ in range(rng.randint(1, 80)):
            record = {"region": f"r{rng.randint(0, 4)}", "model": f"m{int(rng.paretovariate(1.0))}",
                      "model_version": rng.choice(["v1", "v2", "v3", None, "_OTHER"]),
                      "track": rng.choice(["stable", "canary", "shadow"]), "end_ns": 1}
            if rng.random() < 0.3:
                record["name"] = rng.choice(["relevance", "pii", "toxicity", "refusal"])
            assert fold(record) == one.fold(record, now_ms)
        assert batched.folded == one.folded and batched.seen == one.seen
    assert sum(one.folded.values()) > 100  # the bounds were reached


def test_batch_fold_leaves_unhashable_values_to_fold():
    limiter = LabelLimiter({"model": 2}, 1000, {"model": "model"})
    with pytest.raises(TypeError):  # as fold: a label value must be hashable (the jobs validate labels first)
        limiter.batch_fold(0)({"model": ["m"]})
    with pytest.raises(TypeError):
        limiter.fold({"model": ["m"]}, 0)

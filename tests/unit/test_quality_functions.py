"""The quality job's Flink functions without a cluster: fakes stand for Flink's runtime context (keyed state,
metrics) and timer service, so the order of window closing, late partials, dead letters and the state TTL are
checked here; the real stack runs them in ``tests/integration/test_evaluations_pipeline.py``."""

from __future__ import annotations

import json
import pickle

import orjson
import pytest

from infersight.flink_jobs.quality import functions as F
from infersight.flink_jobs.quality.core import EngineParams
from infersight.flink_jobs.quality.stream import engine_key
from infersight.schemas.quality import RELEVANCE
from infersight.schemas.units import NS
from tests.support.keyed_runtime import Counter

T0 = 1_800_000_000
W = 60


class _State:
    def __init__(self, descriptor):
        self.descriptor, self.v, self.d = descriptor, None, {}

    def value(self):
        return self.v

    def update(self, v):
        self.v = pickle.loads(pickle.dumps(v))  # as a state backend: a copy, not the object

    def get(self, k):
        return self.d.get(k)

    def put(self, k, v):
        self.d[k] = pickle.loads(pickle.dumps(v))

    def remove(self, k):
        del self.d[k]

    def keys(self):
        return list(self.d)


class _Runtime:
    def __init__(self):
        self.states, self.counters = [], {}

    def get_state(self, descriptor):
        self.states.append(_State(descriptor))
        return self.states[-1]

    get_map_state = get_state

    def get_metrics_group(self):
        return self

    def counter(self, name):
        return self.counters.setdefault(name, Counter())


class _Ctx:
    def __init__(self, watermark=-(2**63)):
        self.watermark, self.timers = watermark, []

    def timer_service(self):
        return self

    def current_watermark(self):
        return self.watermark

    def current_processing_time(self):
        return 0

    def register_event_time_timer(self, t):
        self.timers.append(t)


def _ev(score, rate, t_s):
    return {"trace_id": "a" * 32, "span_id": "b" * 16, "time_ns": int(t_s * NS), "region": "r1", "name": RELEVANCE,
            "sample_rate": rate, "score": score, "model": "m", "model_version": "v1", "track": "stable"}


def _read(reader, items):
    return list(reader.process_element(orjson.dumps(items).decode(), _Ctx()))


def test_batches_are_read_into_partials_and_dead_letters_on_the_side():
    reader = F.ReadBatches(F.EVALUATIONS_KIND, W, "dlq-tag", "infersight.evaluations",
                           {"region": 5, "model": 5, "model_version": 5, "track": 5, "evaluator": 5})
    runtime = _Runtime()
    reader.open(runtime)
    out = _read(reader, [_ev(0.5, 1.0, T0 + 1), _ev(0.5, 0.0, T0 + 1), _ev(None, 0.5, T0 + 2)])
    letters = [x for tag, x in (o for o in out if o[0] == "dlq-tag")]
    partials = [o for o in out if o[0] != "dlq-tag"]
    assert len(letters) == 1 and "sample_rate" in json.loads(letters[0])["reason"]
    ((key, end_ms, n, _partial),) = partials
    assert (key, end_ms, n) == (engine_key("r1", "m"), (T0 + W) * 1000, 2)
    assert runtime.counters["dead_letters"].n == 1 and runtime.counters["unscored_evaluations"].n == 1
    out = list(reader.process_element(b"\xff\xfe not json", _Ctx()))
    assert [o[0] for o in out] == ["dlq-tag"] and "not a JSON batch" in json.loads(out[0][1])["reason"]


def test_windows_close_in_order_at_the_watermark_and_late_partials_are_counted():
    reader = F.ReadBatches(F.EVALUATIONS_KIND, W, "dlq", "infersight.evaluations")
    reader.open(_Runtime())
    windows = F.QualityWindows(EngineParams(), ttl_s=3600.0)
    runtime = _Runtime()
    windows.open(runtime)
    ctx = _Ctx()
    # the second window's partial first, then two of the first (arrival order is not window order)
    for items in ([_ev(0.2, 1.0, T0 + W + 5)], [_ev(0.9, 1.0, T0 + 5)], [_ev(0.7, 0.5, T0 + 6)]):
        for element in _read(reader, items):
            windows.process_element(element, ctx)
    assert sorted(set(ctx.timers)) == [(T0 + W) * 1000 - 1, (T0 + 2 * W) * 1000 - 1]
    out = list(windows.on_timer((T0 + 2 * W) * 1000 - 1, ctx))  # the watermark jumped past both
    records = [json.loads(row[1]) for tag, row in out if tag == "event"]
    assert [r["window_end"] for r in records] == [T0 + W, T0 + 2 * W]
    assert records[0]["evaluators"][RELEVANCE]["mean"] == pytest.approx((0.9 + 0.7 * 2) / 3)
    assert all(tag == "event" and row[0] == "r1|m|v1|stable" for tag, row in out if tag == "event")
    assert sum(tag == "metrics" for tag, _ in out) == 2
    assert list(windows.on_timer((T0 + W) * 1000 - 1, ctx)) == []  # a timer whose window is gone: nothing
    late = _read(reader, [_ev(0.1, 1.0, T0 + 7), _ev(0.1, 1.0, T0 + 8)])
    for element in late:  # the window closed: late, counted, never fed to the engine out of order
        windows.process_element(element, ctx)
    ctx.watermark = (T0 + 3 * W) * 1000
    for element in _read(reader, [_ev(0.1, 1.0, T0 + 2 * W + 1)]):
        windows.process_element(element, ctx)
    assert runtime.counters["late_records"].n == 3 and runtime.counters["windows_closed"].n == 2
    # every keyed state expires with the key's silence
    assert all(s.descriptor._ttl_config is not None and s.descriptor._ttl_config.get_ttl().to_milliseconds()
               == 3_600_000 for s in runtime.states)

"""The canary job's compact rows (flink_jobs/canary/rows.py) change nothing the bake decides: the same records fed
as whole dicts (the bake's former per-record loop, kept here as the reference) and as routed, pickled rows give
the same reservoirs, counts, version and region checks, and verdicts, whatever fields a record has or lacks (so a
field the bake reads cannot be left out of the projection unnoticed)."""

from __future__ import annotations

import json
import math
import pickle
import random

import numpy as np
import pytest

from infersight.flink_jobs.canary.core import JUDGED, NS, SIDES, Bake, BakeConfig
from infersight.flink_jobs.canary.metrics import DEFAULT_METRICS
from infersight.flink_jobs.canary.rows import BatchColumns, Projector, Rows, rows_of
from infersight.flink_jobs.canary.stream import (
    KEY_SEP,
    CanaryState,
    first_canary_ns,
    judged_item,
    route,
    route_evaluations,
)
from infersight.flink_jobs.common.cardinality import LabelLimiter
from infersight.schemas.quality import PII, RELEVANCE
from infersight.schemas.records import dump_batch, parse_batch

CONFIG = BakeConfig(bake_s=120.0, interval_s=30.0)
READ_FIELDS = ("end_ns", "track", "model_version", "region", JUDGED, "ttft_s", "e2e_s", "itl_p50_s", "decode_s",
               "tokens_out", "error_type", "quality_score", "quality_sample_rate", "guardrail_flagged")


def legacy_add_records(bake: Bake, records: list[dict]) -> None:
    """The bake's per-record loop before the projection (the reference the rows must match)."""
    columns = {s: {m.name: [] for m in bake.config.metrics} for s in SIDES}
    weights = {s: {m.name: [] for m in bake.config.metrics} for s in SIDES}
    for record in records:
        end_ns = record.get("end_ns")
        if not isinstance(end_ns, int) or end_ns < bake.start_ns:
            continue
        track = record.get("track")
        judged = bool(record.get(JUDGED))
        if track not in SIDES:
            bake.untracked += track != "shadow" and not judged
            continue
        if not judged:
            bake.saw(track, str(record.get("model_version") or ""), str(record.get("region", "")), end_ns)
        for spec in bake.config.metrics:
            if judged and not spec.sample_rate_field:
                continue
            value = spec.extract(record)
            if value is None or not math.isfinite(value):
                continue
            weight = 1.0
            if spec.sample_rate_field:
                rate = record.get(spec.sample_rate_field)
                if not isinstance(rate, int | float) or not 0 < rate <= 1:
                    continue
                weight = 1.0 / rate
            columns[track][spec.name].append(value)
            weights[track][spec.name].append(weight)
    for side in SIDES:
        for name, values in columns[side].items():
            if values:
                bake.add_values(side, name, np.array(values), np.array(weights[side][name]))


def legacy_feed(state: CanaryState, key: str, records: list[dict]) -> int | None:
    """``CanaryState.feed`` before the projection, on whole records."""
    canary = [r for r in records if r.get("track") == "canary" and not r.get(JUDGED)]
    if state.bake is None:
        versions = {str(r.get("model_version") or "") for r in canary}
        if not canary or (state.final is not None and versions <= {state.final["canary_version"]}):
            return None
        model, _, region = key.partition(KEY_SEP)
        state.bake = Bake(model, region, min(r["end_ns"] for r in canary), state.config)
    legacy_add_records(state.bake, records)
    return state.next_look_ns()


def legacy_route(batch: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for item in batch:
        for region in (item["region"], ""):
            out.setdefault(f"{item['model']}{KEY_SEP}{region}", []).append(item)
    return out


def messy_records(rng: random.Random, n: int, t0_s: float, slow: float = 1.0, clean_labels: bool = False,
                  odd: float = 0.04) -> list[dict]:
    """Request-like records with every field the bake reads present, absent, None, of odd types or out of range
    at random (and fields it does not read), over two versions of each track, three regions and two models;
    ``clean_labels``: every track and version label as a rollout has them (so that verdicts are reached)."""
    out = []
    for _ in range(n):
        track = rng.choices(["stable", "canary", "shadow", None, "blue"], [60, 30, 5, 0, 0] if clean_labels
                            else [60, 30, 5, 3, 2])[0]
        ttft = rng.lognormvariate(math.log(0.05 * (slow if track == "canary" else 1.0)), 0.5)
        canary_version = "v2" if clean_labels else rng.choice(["v2", "v2", "v3"])
        rec = {"trace_id": f"{rng.getrandbits(128):032x}", "model": rng.choice(["m", "m", "n"]),
               "region": rng.choice(["us", "eu", "ap"]), "end_ns": int((t0_s + rng.random() * 30) * NS),
               "track": track, "model_version": canary_version if track == "canary" else "v1",
               "ttft_s": ttft, "e2e_s": ttft * 8, "itl_p50_s": 0.01, "decode_s": 0.4, "tokens_out": 41,
               "tokens_in": 100, "engine": "vllm", "finish_reason": "stop", "error_type": None}
        for field in READ_FIELDS[3 if clean_labels else 1:]:
            if rng.random() < odd:
                rec[field] = rng.choice([None, True, False, 0, -1, 2, 0.5, float("nan"), float("inf"), "x", ""])
            elif rng.random() < odd:
                rec.pop(field, None)
        if rng.random() < 0.05:
            rec["error_type"] = "500"
        if rng.random() < 0.05:
            rec["end_ns"] = int((t0_s - 5) * NS)  # before the bake's start
        out.append(rec)
    return out


def bake_state(bake: Bake) -> dict:
    state = bake.to_state()
    for metrics in state["sides"].values():
        for acc in metrics.values():
            for k in ("values", "keys"):
                if k in acc:
                    acc[k] = acc[k].tolist()
    return state


def test_the_projection_keeps_every_field_the_bake_reads():
    rng = random.Random(5)
    for round_ in range(40):
        records = messy_records(rng, 300, 10.0)
        old, new = Bake("m", "", int(10 * NS), CONFIG), Bake("m", "", int(10 * NS), CONFIG)
        legacy_add_records(old, records)
        new.add_rows(pickle.loads(pickle.dumps(rows_of(records))))
        assert bake_state(new) == bake_state(old), round_
        assert list(new.versions["canary"]) == list(old.versions["canary"])  # insertion order breaks ties
        assert list(new.region_last_ns) == list(old.region_last_ns)


def test_each_metric_gets_its_value_from_the_projection():
    record = {"end_ns": 5 * NS, "track": "canary", "model_version": "v2", "region": "us", "ttft_s": 0.1,
              "e2e_s": 0.9, "itl_p50_s": 0.02, "decode_s": 0.8, "tokens_out": 5, "error_type": None}
    row = Projector().row(record)
    assert row is not None
    values = dict(zip([m.name for m in DEFAULT_METRICS], row[5], strict=True))
    assert values["ttft_s"] == 0.1 and values["e2e_s"] == 0.9 and values["itl_s"] == 0.02
    assert values["tpot_s"] == 0.2 and values["output_tokens"] == 5.0 and values["error_ratio"] == 0.0
    assert math.isnan(values["quality_score"]) and math.isnan(values["guardrail_flag_ratio"])
    judged = {JUDGED: True, "end_ns": 5 * NS, "track": "stable", "model_version": "v1", "region": "us",
              "quality_score": 0.7, "quality_sample_rate": 0.25, "guardrail_flagged": True, "ttft_s": 1.0}
    row = Projector().row(judged)
    assert row is not None and row[2] is True and row[6] == (4.0, 4.0)
    values = dict(zip([m.name for m in DEFAULT_METRICS], row[5], strict=True))
    assert values["quality_score"] == 0.7 and values["guardrail_flag_ratio"] == 1.0
    assert math.isnan(values["ttft_s"])  # a judged result feeds the sampled metrics only
    assert Projector().row({**record, "track": "shadow"}) is None  # no bake reads the shadow track
    assert Projector().row({**judged, "track": None}) is None      # nor a result without a track


@pytest.mark.parametrize("odd", [0.0, 0.01])
def test_routed_rows_give_the_same_verdicts_as_whole_records(odd):
    """The job's path (route -> pickle -> feed, looks) against the former one (whole records per key), over a
    bake that ends in a verdict, with judged results in the same keys; batches of well-typed records (projected
    at once, ``BatchColumns``) and with odd fields (record by record)."""
    rng = random.Random(11)
    limiter = LabelLimiter({"model": 10, "region": 10})
    old: dict[str, CanaryState] = {}
    new: dict[str, CanaryState] = {}
    events_old, events_new = [], []
    for k in range(6):
        t0 = 10.0 + k * 30
        raw = dump_batch([r for r in messy_records(rng, 1500, t0, slow=1.3, clean_labels=True, odd=odd)
                          if isinstance(r.get("end_ns"), int) and isinstance(r.get("region"), str)])
        batch = parse_batch(raw)  # as the job reads it (NaN and infinity become null)
        assert (BatchColumns.of(batch, DEFAULT_METRICS) is not None) == (odd == 0.0)
        results = [{"time_ns": r["end_ns"] + 1000, "model": r["model"], "model_version": r.get("model_version"),
                    "track": r.get("track"), "region": r["region"], "name": rng.choice([RELEVANCE, PII]),
                    "score": rng.random(), "sample_rate": 0.5} for r in batch[::7] if isinstance(r.get("track"), str)]
        keyed, letters = route(raw, limiter, 0)
        judged, _ = route_evaluations(json.dumps(results), limiter, 0)
        assert not letters
        judged_old = legacy_route([judged_item(r) for r in results])
        for key, records in legacy_route(batch).items():
            state = old.setdefault(key, CanaryState(None, CONFIG))
            legacy_feed(state, key, records)
            legacy_feed(state, key, judged_old.get(key, []))
        for key, rows in keyed.items():
            state = new.setdefault(key, CanaryState(None, CONFIG))
            payload = pickle.loads(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))
            assert first_canary_ns(payload) == first_canary_ns(legacy_route(batch)[key])
            state.feed(key, payload)
            if key in judged:
                state.feed(key, pickle.loads(pickle.dumps(judged[key])))
        at_ns = int((t0 + 30) * NS)
        for states, events in ((old, events_old), (new, events_new)):
            for key in sorted(states):
                event, _ = states[key].look(at_ns)
                events.append(event)
    assert events_new == events_old
    finals = [e for e in events_new if e is not None and e["final"]]
    assert finals and any(e["verdict"] != "inconclusive" for e in events_new if e is not None)


def test_rows_round_trip_through_pickle():
    rng = random.Random(2)
    records = messy_records(rng, 500, 10.0)
    rows = rows_of(records)
    back = pickle.loads(pickle.dumps(rows))
    assert isinstance(back, Rows) and len(back) == len(rows) and back.labels == rows.labels
    row = Projector().row({"end_ns": 1, "track": "stable", "model_version": "v1", "region": "us"})
    assert row is not None
    back.append(row)  # after unpickling, a known label keeps its index
    assert len(back) == len(rows) + 1 and back.labels[back.label[-1]] == (1, "v1", "us")
    assert len(back.labels) == len(rows.labels)
    for few in ([], [{"end_ns": 1, "track": None}], [{"end_ns": 1, "track": "stable", "ttft_s": 0.5}]):
        again = pickle.loads(pickle.dumps(rows_of(few)))  # no row, no finite value, one column
        assert decoded(again) == decoded(rows_of(few))


def test_route_folds_as_record_by_record_at_the_bounds():
    """The route asks the cardinality bound once per (model, region) and batch: the keys and rows it sends are
    those of folding each record, with bounds reached, stale values freed and a region missing or empty."""
    rng = random.Random(8)
    once, per_record = LabelLimiter({"model": 4, "region": 3}, 1000), LabelLimiter({"model": 4, "region": 3}, 1000)
    now_ms = 0
    for _ in range(40):
        now_ms += rng.choice([10, 600, 1500])
        batch = [{"model": f"m{rng.randint(0, 6)}", "region": rng.choice(["a", "b", "c", "d", ""]),
                  "end_ns": 1, "track": "stable", "ttft_s": 0.1} for _ in range(rng.randint(1, 60))]
        for r in batch[::5]:
            del r["region"]
        keyed, _ = route(dump_batch(batch), once, now_ms)
        expected: dict[str, int] = {}
        for r in batch:
            folded = per_record.fold(r, now_ms)
            if "_OTHER" not in (folded.get("model"), folded.get("region")):
                for region in (r.get("region", ""), ""):
                    key = f"{r['model']}{KEY_SEP}{region}"
                    expected[key] = expected.get(key, 0) + 1
        assert {k: len(v) for k, v in keyed.items()} == expected
        assert once.seen == per_record.seen


def decoded(rows: Rows) -> list[tuple]:
    """Each row as (end, side, version, region, judged, values, weights), NaN as None: label tables may differ."""
    n = len(rows)
    if not n:
        return []
    values = np.frombuffer(rows.values, dtype=np.float64).reshape(n, -1)
    weights = np.frombuffer(rows.weights, dtype=np.float64).reshape(n, -1)
    return [(rows.end_ns[i], *rows.labels[rows.label[i]], bool(rows.judged[i]),
             tuple(None if math.isnan(x) else x for x in values[i]),
             tuple(None if math.isnan(x) else x for x in weights[i])) for i in range(n)]


def test_batch_columns_project_as_record_by_record():
    rng = random.Random(6)
    for _ in range(20):
        records = parse_batch(dump_batch(messy_records(rng, 400, 10.0, odd=0.0)))
        for r in records[::9]:
            r.update(ttft_s=None, decode_s=None, tokens_out=rng.choice([0, 1, 2, None]))
        for r in records[::11]:
            r.update(track=rng.choice([None, "blue", "shadow"]), model_version=None, error_type=rng.choice(["", "x"]))
        columns = BatchColumns.of(records, DEFAULT_METRICS)
        assert columns is not None
        indices = list(range(0, len(records), 2))
        fast = columns.rows(tuple(m.name for m in DEFAULT_METRICS), indices)
        slow = rows_of([records[i] for i in indices])
        assert fast is not None and decoded(fast) == decoded(slow)
        assert decoded(pickle.loads(pickle.dumps(fast))) == decoded(slow)
    odd = parse_batch(dump_batch(messy_records(rng, 50, 10.0, odd=0.0)))
    for change in ({"ttft_s": 1}, {"tokens_out": True}, {"track": 3}, {JUDGED: True}, {"quality_sample_rate": 0.5},
                   {"tokens_out": 1 << 60}):
        assert BatchColumns.of([*odd, {**odd[0], **change}], DEFAULT_METRICS) is None  # record by record instead

"""The fleet simulator without a stack: its telemetry decodes to the same records as the real SDK's for
the same request, it is deterministic for a seed, its load and faults have the shapes it claims."""

from __future__ import annotations

import time

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from infersight.flink_jobs.normalize.evaluations import evaluations_from_payload
from infersight.flink_jobs.normalize.pod_gauges import gauges_from_payload
from infersight.flink_jobs.normalize.span_records import Rejected, records_from_payload
from infersight.instrumentation import Instrumentation
from infersight.instrumentation.config import Settings
from infersight.schemas.units import NS
from infersight.simulator.encode import ENGINE, JUDGE_DELAY_NS, Encoder, gauges, resource_attributes
from infersight.simulator.fleet import FleetSpec, Perturbation
from infersight.simulator.ledger import Ledger
from infersight.simulator.workload import ALL_ERRORS, Fleet, pod_gauges, step_gap_list, step_gaps


def decode_all(payloads: dict[str, list[bytes]], now_ns: int) -> dict[str, object]:
    out = {}
    for region, batch in payloads.items():
        for payload in batch:
            for item in records_from_payload(payload, now_ns):
                assert not isinstance(item, Rejected), item.problems
                assert item.region == region
                out[item.trace_id] = item
    return out


class FixedIds(IdGenerator):
    def __init__(self, trace_id: bytes, span_id: bytes) -> None:
        self.trace_id, self.span_ids = int.from_bytes(trace_id, "big"), [int.from_bytes(span_id, "big")]

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_ids.pop(0) if self.span_ids else 0x1234 + len(self.span_ids)


def sdk_payload(fleet: Fleet, tick, i: int, evaluations=(), judge_rate: float = 1.0) -> tuple[bytes, int]:
    """Drive the real SDK through request ``i`` of ``tick`` with a scripted clock, then (after the request) its
    ``evaluations`` ((name, score, label) each, ``JUDGE_DELAY_NS`` apart); return the OTLP payload and the
    number of spans."""
    pod = fleet.pods[int(tick.pod[i])]
    q, p, d, tail = (int(x[i]) for x in (tick.queue_ns, tick.prefill_ns, tick.decode_ns, tick.tail_ns))
    t_in, t_cached, t_out, err = (int(x[i]) for x in (tick.tokens_in, tick.tokens_cached, tick.tokens_out,
                                                      tick.error))
    end = int(tick.end_ns[i])
    start = end - (q + p + (d if t_out else 0) + tail)
    now = [start]
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON if tick.sampled[i] else ALWAYS_OFF,
                              resource=Resource(resource_attributes(pod)),
                              id_generator=FixedIds(tick.trace_ids[16 * i:16 * i + 16], tick.span_ids[8 * i:8 * i + 8]))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = Instrumentation(tracer_provider=provider, meter_provider=MeterProvider(), engine=ENGINE, gpu=False,
                           settings=Settings(region=pod.region.name, track=pod.track, model_version=pod.version),
                           clock=lambda: now[0], wall_clock=lambda: now[0])
    req = inst.request(pod.model.name).start()
    queue = req.stage("queue")
    now[0] += q
    queue.end()
    prefill = req.stage("prefill")
    now[0] += p
    if t_out:
        req.first_token()
        prefill.end()
        decode = req.stage("decode")
        for gap in step_gap_list(t_out - 1, *(int(g) for g in tick.gap_ns[i])):
            now[0] += gap
            req.token()
        decode.end()
    else:
        prefill.end()
    req.usage(input_tokens=t_in, output_tokens=t_out)
    if t_cached:
        req.prefix_cache(t_in, t_cached)
    if err >= 0:
        req.error(ALL_ERRORS[err])
    now[0] = end
    req.finish(None)
    for name, score, label in evaluations:
        now[0] += JUDGE_DELAY_NS
        req.evaluation(name, score, label, sample_rate=judge_rate)
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans()).SerializeToString(), len(exporter.get_finished_spans())


def sdk_replay(fleet: Fleet, tick, i: int):
    """Request ``i`` of ``tick`` through the real SDK: its record and the number of spans."""
    payload, spans = sdk_payload(fleet, tick, i)
    end = int(tick.end_ns[i])
    records = [r for r in records_from_payload(payload, end + NS) if not isinstance(r, Rejected)]
    assert len(records) == 1
    return records[0], spans


def test_simulated_and_sdk_telemetry_decode_to_identical_records():
    spec = FleetSpec(rate_rps=3000, error_rate=0.05, timeout_rate=0.02, sample_ratio=0.2,
                     perturbations=(Perturbation("pod_down", 0, 60, region="eu-west-1", pod=0),))
    fleet = Fleet(spec, seed=11)
    tick = fleet.tick(3, time.time_ns() - 60 * NS, 1.0)
    sim = decode_all(Encoder(fleet.pods).spans(tick), time.time_ns())
    assert len(sim) == len(tick)
    # every shape of request: errors before/after the first token, one token, sampled, cached, timeouts
    picks: dict[str, int] = {}
    for i in range(len(tick)):
        t_out, err = int(tick.tokens_out[i]), int(tick.error[i])
        for name, hit in (("ok", err < 0 and t_out > 2), ("one_token", t_out == 1), ("no_token", t_out == 0),
                          ("error_mid", err >= 0 and t_out > 1), ("timeout", ALL_ERRORS[err] == "timeout"),
                          ("pod_down", ALL_ERRORS[err] == "EngineDeadError"),
                          ("sampled", bool(tick.sampled[i])), ("cached", int(tick.tokens_cached[i]) > 0)):
            if hit and name not in picks:
                picks[name] = i
    assert set(picks) == {"ok", "one_token", "no_token", "error_mid", "timeout", "pod_down", "sampled", "cached"}
    for name, i in picks.items():
        sdk, spans = sdk_replay(fleet, tick, i)
        assert sim[sdk.trace_id] == sdk, name
        assert spans == (1 + 2 + (tick.tokens_out[i] > 0) if tick.sampled[i] else 1), name


def test_sampled_traces_carry_stage_spans_under_the_root():
    fleet = Fleet(FleetSpec(rate_rps=2000, sample_ratio=0.5), seed=2)
    tick = fleet.tick(0, time.time_ns(), 0.5)
    spans = []
    for batch in Encoder(fleet.pods).spans(tick).values():
        for payload in batch:
            for rs in ExportTraceServiceRequest.FromString(payload).resource_spans:
                spans += list(rs.scope_spans[0].spans)
    roots = {s.span_id: s for s in spans if not s.parent_span_id}
    children = [s for s in spans if s.parent_span_id]
    assert len(roots) == len(tick) and children
    for child in children:
        root = roots[child.parent_span_id]
        assert child.trace_id == root.trace_id and child.name in ("queue", "prefill", "decode")
        assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= root.end_time_unix_nano
    assert len({s.span_id for s in spans}) == len(spans)


def test_same_seed_same_telemetry_and_different_seed_differs():
    t0 = 1_700_000_000 * NS
    a, b, c = (Fleet(FleetSpec(rate_rps=1000), seed=s) for s in (5, 5, 6))
    enc = Encoder(a.pods)
    assert enc.spans(a.tick(7, t0, 0.5)) == enc.spans(b.tick(7, t0, 0.5))
    assert enc.spans(a.tick(7, t0, 0.5)) != enc.spans(c.tick(7, t0, 0.5))


def test_rates_diurnal_curve_and_queueing_grow_with_load():
    spec = FleetSpec(rate_rps=5000, diurnal_amplitude=0.0)
    fleet = Fleet(spec, seed=1)
    ticks = [fleet.tick(k, 0, 1.0) for k in range(5)]
    assert sum(len(t) for t in ticks) / 5 == pytest.approx(5000, rel=0.03)
    ledger = Ledger()
    for t in ticks:
        ledger.add(t, fleet.pods)
    regions = ledger.by("region")
    assert regions["us-east-1"] / ledger.total == pytest.approx(0.45, abs=0.02)
    assert ledger.by("track")["canary"] / ledger.total == pytest.approx(0.10, abs=0.01)
    busy = fleet.tick(0, 0, 1.0, scale=1.5)
    calm = fleet.tick(0, 0, 1.0, scale=0.3)
    assert np.median(busy.queue_ns) > 3 * np.median(calm.queue_ns)
    # diurnal: a day of 100 s swings the offered rate by the amplitude
    day = Fleet(FleetSpec(rate_rps=5000, diurnal_amplitude=0.5, day_s=100.0), seed=1)
    east = [p.index for p in day.pods if p.region.name == "us-east-1"]
    rates = [day.pod_state(t).rate_rps[east].sum() for t in range(0, 100, 5)]
    assert max(rates) / min(rates) == pytest.approx(1.5 / 0.5, rel=0.05)
    # heavy tail: the longest outputs are far above the median
    out = np.concatenate([t.tokens_out for t in ticks])
    assert np.percentile(out, 99.9) > 10 * np.median(out)


def test_perturbations_slow_a_region_and_regress_the_canary():
    base = FleetSpec(rate_rps=3000)
    slow = FleetSpec(rate_rps=3000, perturbations=(
        Perturbation("slow", 0, 10, magnitude=3.0, region="ap-southeast-1"),
        Perturbation("canary_regression", 0, 10, magnitude=2.0, model="llama-3.1-8b-instruct")))
    a, b = Fleet(base, seed=4), Fleet(slow, seed=4)
    ta, tb = a.tick(1, 0, 1.0), b.tick(1, 0, 1.0)

    def median_prefill(fleet, tick, region=None, track=None, model=None):
        sel = [i for i, p in enumerate(tick.pod) if (region is None or fleet.pods[p].region.name == region)
               and (track is None or fleet.pods[p].track == track)
               and (model is None or fleet.pods[p].model.name == model)]
        return np.median(tick.prefill_ns[sel])

    assert median_prefill(b, tb, "ap-southeast-1") > 2.5 * median_prefill(a, ta, "ap-southeast-1")
    assert median_prefill(b, tb, "us-east-1", "stable") == pytest.approx(median_prefill(a, ta, "us-east-1", "stable"),
                                                                          rel=0.01)
    model = "llama-3.1-8b-instruct"
    assert median_prefill(b, tb, "us-east-1", "canary", model) > 1.7 * median_prefill(a, ta, "us-east-1", "canary",
                                                                                       model)
    assert (b.pod_state(10.0).slow == 1.0).all()  # over when its duration is
    with pytest.raises(ValueError, match="kind"):
        Perturbation("meteor", 0, 1)


def test_step_gaps_sum_and_summary_match_the_spelled_out_list():
    from infersight.instrumentation.summary import itl_summary

    rng = np.random.default_rng(3)
    for n in list(range(0, 40)) + [99, 100, 101, 1000]:
        q = np.sort(rng.integers(1_000, 50_000_000, 4))
        eff, total = step_gaps(np.array([n]), *(np.array([v]) for v in q))
        gaps = step_gap_list(n, *(int(v) for v in eff[0]))
        assert sum(gaps) == int(total[0])
        if n:
            times = np.concatenate([[0], np.cumsum(gaps)]).tolist()
            s = itl_summary(times)
            assert (s.p50_s, s.p90_s, s.p99_s, s.max_s) == tuple(int(v) / 1e9 for v in eff[0])


def test_pod_gauges_decode_per_pod_and_stop_for_a_downed_pod():
    spec = FleetSpec(rate_rps=2000, perturbations=(Perturbation("pod_down", 0, 10, region="us-east-1", pod=0),))
    fleet = Fleet(spec, seed=1)
    state = fleet.pod_state(1.0)
    values = {k: v.tolist() for k, v in pod_gauges(fleet, state, np.random.default_rng(0)).items()}
    up = [i for i in range(len(fleet.pods)) if not state.down[i]]
    points = [g for payload in gauges(fleet.pods, values, 123 * NS, up).values() for g in gauges_from_payload(payload)]
    assert all(isinstance(g, dict) for g in points), [g for g in points if not isinstance(g, dict)][:3]
    pods = {g["pod"].split("/")[0] for g in points}
    downed = {p.name for p in fleet.pods if state.down[p.index]}
    assert downed and not pods & downed and len(pods) == len(up)
    gpu = [g for g in points if g["metric"] == "hw.gpu.utilization"]
    assert len(gpu) == sum(fleet.pods[i].model.gpus_per_pod for i in up)
    assert all(0.0 <= g["value"] <= 1.0 for g in gpu)
    # each gauge names the deployment its pod serves, so gauges and cost roll up per model, version, track
    by_name = {p.name: p for p in fleet.pods}
    for g in points:
        pod = by_name[g["pod"].split("/")[0]]
        assert (g["model"], g["model_version"], g["track"]) == (pod.model.name, pod.version, pod.track)


def test_a_metrics_export_leaves_normalize_as_gauge_batches_that_roll_up_like_the_points(monkeypatch):
    from infersight.flink_jobs.common import keys
    from infersight.flink_jobs.metrics import core
    from infersight.flink_jobs.normalize import core as N
    from infersight.schemas.records import parse_batch
    from infersight.schemas.topics import OTLP_METRICS, PODS

    fleet = Fleet(FleetSpec(rate_rps=6000), seed=1)
    state = fleet.pod_state(1.0)
    values = {k: v.tolist() for k, v in pod_gauges(fleet, state, np.random.default_rng(0)).items()}
    payload = gauges(fleet.pods, values, 123 * NS)["us-east-1"]
    points = list(gauges_from_payload(payload))
    monkeypatch.setattr(N, "MAX_BATCH_GAUGES", 100)
    out = list(N.normalize(OTLP_METRICS.name, 0, 7, payload, 200 * NS))
    assert {topic for topic, _v, _ms in out} == {PODS.name}
    assert len(out) == -(-len(points) // 100) > 1  # one message per 100 points, not one per point
    batches = [parse_batch(value) for _t, value, _ms in out]
    assert [g for batch in batches for g in batch] == points
    stamps = [ms for _t, _v, ms in out]
    assert stamps == [max(g["time_ns"] for g in batch) // 1_000_000 for batch in batches]

    # the metrics job's grouping: by deployment (and roll-ups) and 10 s window; a window that fired drops its points
    flat = [g for batch in batches for g in batch]
    groups, late = core.group_gauges(flat, 10_000, watermark_ms=0)
    region = keys.deployment_rollups(keys.deployment_key(points[0]))[1]  # the region's roll-up
    assert late == 0 and {end for _key, end in groups} == {130_000} and (region, 130_000) in groups
    assert core.PodWindow.of(groups[region, 130_000]).stats() == core.PodWindow.of(points).stats()
    assert core.group_gauges(flat, 10_000, watermark_ms=129_999) == ({}, len(flat))


def evaluations_of(payloads: dict[str, list[bytes]]) -> list[dict]:
    out = []
    for batch in payloads.values():
        for payload in batch:
            items = list(evaluations_from_payload(payload))
            assert all(isinstance(item, dict) for item in items), items
            out += items
    return out


def test_judged_requests_carry_the_evaluation_results_the_sdk_would_export():
    """1 % judged: per judged request a relevance score and the refusal and PII flags, each on a late
    ``gen_ai.evaluation`` child span as the SDK exports a judge's result after its request: the same records
    once normalize decodes both; the request records are unchanged by them."""
    spec = FleetSpec(rate_rps=3000, judge_rate=0.02, sample_ratio=0.3)
    fleet = Fleet(spec, seed=5)
    tick = fleet.tick(2, time.time_ns() - 60 * NS, 1.0)
    payloads = Encoder(fleet.pods, spec.judge_rate).spans(tick)
    assert len(decode_all(payloads, time.time_ns())) == len(tick)  # the judges' spans are not requests
    evaluations = evaluations_of(payloads)
    judged = tick.judged.nonzero()[0]
    assert len(judged) > 20 and len(evaluations) == 3 * len(judged)
    assert not (tick.judged & (tick.error >= 0)).any()  # a failed request has no answer to judge
    by_trace: dict[str, list[dict]] = {}
    for rec in evaluations:
        by_trace.setdefault(rec["trace_id"], []).append(rec)
    for i in judged[:3].tolist() + [j for j in judged.tolist() if not tick.sampled[j]][:2]:
        sim = sorted(by_trace[tick.trace_ids[16 * i:16 * i + 16].hex()], key=lambda r: r["name"])
        results = [(r["name"], r["score"], r["label"]) for r in sorted(sim, key=lambda r: r["time_ns"])]
        payload, _ = sdk_payload(fleet, tick, i, results, spec.judge_rate)
        sdk = sorted(evaluations_of({"r": [payload]}), key=lambda r: r["name"])
        assert sim == sdk
        assert {r["span_id"] for r in sim} == {tick.span_ids[8 * i:8 * i + 8].hex()}  # joins its request
        assert all(r["sample_rate"] == 0.02 and r["model_version"] and r["track"] for r in sim)


def test_quality_perturbations_move_the_judged_results_only_where_they_hit():
    hit = {"region": "eu-west-1", "at_s": 0.0, "duration_s": 600.0}
    spec = FleetSpec(rate_rps=4000, judge_rate=0.5, perturbations=(
        Perturbation("quality_drop", magnitude=0.1, **hit), Perturbation("guardrail_surge", magnitude=0.2, **hit),
        Perturbation("prompt_shift", magnitude=3.0, **hit)))
    fleet = Fleet(spec, seed=8)
    tick = fleet.tick(1, 0, 1.0)
    region = np.array([fleet.pods[int(p)].region.name for p in tick.pod])
    hit_mask, calm = tick.judged & (region == "eu-west-1"), tick.judged & (region != "eu-west-1")
    assert tick.relevance[calm].mean() - tick.relevance[hit_mask].mean() == pytest.approx(0.1, abs=0.03)
    assert tick.refused[hit_mask].mean() > tick.refused[calm].mean() + 0.05
    assert tick.pii[hit_mask].mean() == pytest.approx(0.205, abs=0.05) and tick.pii[calm].mean() < 0.03
    assert np.median(tick.tokens_in[region == "eu-west-1"]) > 2 * np.median(tick.tokens_in[region != "eu-west-1"])
    # the judges draw from a stream of their own: the requests' times are the calm fleet's
    calm_spec = FleetSpec(rate_rps=4000, judge_rate=0.5)
    same = Fleet(calm_spec, seed=8).tick(1, 0, 1.0)
    assert np.array_equal(same.end_ns, tick.end_ns) and np.array_equal(same.queue_ns, tick.queue_ns)

"""What ``bench/fuzz.py`` found, as tests, and a fast smoke of every fuzz target without atheris.

Each open finding is a test marked ``xfail(strict=True)`` naming the bug: when the bug is fixed the test
passes, strict xfail fails the run, and the marker (and the signature in ``OPEN``) come off. The smoke test
replays every target's seeds and a few thousand deterministic mutations of them and fails on any finding
that is not one of ``OPEN``: a new crash, a hang (pytest-timeout) or a changed signature.
"""

from __future__ import annotations

import logging
import math
import random

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from bench import fuzz
from infersight.schemas import metrics as M

# Open findings by signature (bench.fuzz.signature), each with the bug it stands for (none open now).
OPEN: dict[str, str] = {}


def finding(target: str, data: bytes) -> str | None:
    """The signature of what ``data`` makes ``target`` find, None when nothing."""
    try:
        fuzz.replay(target, data)
    except Exception as exc:  # noqa: BLE001 - every exception is a finding
        return fuzz.signature(exc)[0]
    return None


def expect_fixed(target: str, data: bytes) -> None:
    sig = finding(target, data)
    assert sig is None, sig


# ---- record_batches: infersight.requests messages as the metrics and archive jobs read them

VALID = (b'{"trace_id":"0af7651916cd43dd8448eb211c80319c","region":"r","model":"m","start_ns":1779999990000000000,'
         b'"end_ns":1779999991000000000,"e2e_s":0.5,"finish_reason":"stop"')


@pytest.mark.parametrize("batch", [b"[1]", b'["ab"]', b"[null]"])
def test_validate_never_raises_on_an_item_that_is_not_an_object(batch):
    expect_fixed("record_batches", batch)


def test_the_metrics_job_survives_a_record_off_the_contract():
    expect_fixed("record_batches", b'{"a":[]}')


def test_the_archive_job_drops_an_integer_beyond_int64():
    expect_fixed("record_batches", b'[{"region":"r","end_ns":18446744073709551615}]')


def test_a_record_validate_accepts_never_fails_the_metrics_job():
    expect_fixed("record_batches", b"[" + VALID + b',"engine":5}]')


def test_a_unit_separator_in_a_model_name_does_not_fail_the_metrics_job():
    expect_fixed("record_batches", b"[" + VALID.replace(b'"model":"m"', b'"model":"a\\u001fb"') + b"}]")


def test_a_valid_record_goes_through_both_jobs():
    expect_fixed("record_batches", b"[" + VALID + b"}]")


# ---- otlp_metrics: pod gauges from the normaliser to the metrics job's pod roll-up

def _gauge(value: float, time_ns: int, resource: dict[str, str] | None = None) -> bytes:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    for key, text in (resource or {"cloud.region": "us-east-1"}).items():
        rm.resource.attributes.add(key=key).value.string_value = text
    point = rm.scope_metrics.add().metrics.add(name=M.QUEUE_DEPTH).gauge.data_points.add(time_unix_nano=time_ns)
    point.as_double = value
    return request.SerializeToString()


def test_a_nan_pod_gauge_does_not_fail_the_pod_roll_up():
    expect_fixed("otlp_metrics", _gauge(math.nan, fuzz_seeds_now()))


def test_a_pod_gauge_from_the_far_future_does_not_fail_the_pod_roll_up():
    expect_fixed("otlp_metrics", _gauge(1.0, 2**64 - 1))


@pytest.mark.parametrize("attribute", ["cloud.region", "gen_ai.request.model", "infersight.model.version"])
def test_a_unit_separator_in_a_pod_label_does_not_fail_the_pod_roll_up(attribute):
    resource = {"cloud.region": "us-east-1", "gen_ai.request.model": "m", attribute: "a\x1fb"}
    expect_fixed("otlp_metrics", _gauge(3.0, fuzz_seeds_now(), resource))


def test_a_pod_gauge_goes_through_the_pod_roll_up():
    expect_fixed("otlp_metrics", _gauge(3.0, fuzz_seeds_now()))


def fuzz_seeds_now() -> int:
    from tests.support.fuzz_seeds import NOW_NS

    return NOW_NS


# ---- attributes: hostile values through the instrumentation's API and the real SDK

def exported(request_with) -> None:
    """Run ``request_with(inst)`` on a fresh Instrumentation over the SDK, then the fuzz target's checks."""
    inst, exporter, bad_inputs = fuzz._instrumented()
    request_with(inst)
    fuzz.exported_ok(exporter, bad_inputs, "test")


def test_a_model_name_with_a_lone_surrogate_is_exported():
    def request_with(inst):
        with inst.request("llama\ud800"):
            pass

    exported(request_with)


def test_a_stage_name_that_is_not_a_string_is_exported():
    def request_with(inst):
        with inst.request("m") as req:
            req.stage(0.0).end()

    exported(request_with)


@pytest.mark.parametrize("score", ["high", [0.5]])
def test_evaluation_with_a_score_that_is_not_a_number_does_not_raise(score):
    def request_with(inst):
        with inst.request("m") as req:
            req.evaluation("judge", score)

    exported(request_with)


@pytest.mark.parametrize("misuse", ["verdict", "stage", "set_attribute"])
def test_unhashable_names_do_not_raise(misuse):
    def request_with(inst):
        with inst.request("m") as req:
            if misuse == "verdict":
                req.safety("input").verdict(["pass"])
            elif misuse == "stage":
                req.stage(["queue"]).end()
            else:
                req.stage("queue").set_attribute(["key"], 1)

    exported(request_with)


def test_an_unhashable_operation_is_bad_input_not_an_internal_error():
    def request_with(inst):
        with inst.request("m", operation={"name": "chat"}):
            pass

    exported(request_with)


def test_distinct_model_names_do_not_grow_the_metrics_without_bound():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from infersight.instrumentation import Instrumentation, Settings

    reader = InMemoryMetricReader()
    inst = Instrumentation(tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader]),
                           settings=Settings(), gpu=False)
    logging.disable(logging.CRITICAL)
    try:
        for i in range(2500):
            with inst.request(f"model-{i}") as req:
                req.usage(input_tokens=3, output_tokens=2)
    finally:
        logging.disable(logging.NOTSET)
    points = {m.name: len(m.data.data_points) for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    assert points[M.GEN_AI_SERVER_REQUEST_DURATION] <= 2001, points  # 2,000 and the overflow series


def test_the_sdk_encoder_still_checks_every_span_once_the_resource_is_known():
    """``exported_ok`` runs the SDK's encoder whole on a batch with a resource or scope it has not seen, then span
    by span: a span only the SDK's encoder refuses is still found on a later input."""
    inst, exporter, bad_inputs = fuzz._instrumented()
    with inst.request("m"):
        pass
    fuzz.exported_ok(exporter, bad_inputs, "first")
    exporter.clear()
    with inst.request("m") as req:
        req.stage("queue").end()
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    spans[0]._name = 0.0  # past our checks: our encoder writes its str, the SDK's cannot write it
    with pytest.raises(TypeError) as raised:
        fuzz.exported_ok(exporter, bad_inputs, "second")
    assert fuzz.signature(raised.value)[0].endswith("trace_encoder/__init__.py:_encode_span")


def test_hostile_values_within_the_types_are_exported():
    def request_with(inst):
        with inst.request("x" * 5000 + "\x1f\x00é😀", operation="chat") as req:
            with req.stage("queue", **{"k\x00": [1, "a", None], "big": 2**70, "nan": math.nan}) as stage:
                stage.set_attribute("b", b"\xff")
            req.usage(input_tokens=2**64, output_tokens=-1, cached_tokens=True)
            req.error("\x00")
            req.response(["m"], {"id": 1})
            req.finish("bored")

    exported(request_with)


# ---- the smoke: every target over its seeds and mutations of them, without atheris

def _mutants(seeds: list[bytes], n: int, rng: random.Random):
    yield from seeds
    for _ in range(n):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            roll = rng.random()
            if data and roll < 0.5:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif roll < 0.75:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
            elif data:
                lo = rng.randrange(len(data))
                del data[lo:lo + rng.randint(1, 16)]
        yield bytes(data)


SMOKE_RUNS = {"otlp_spans": 3000, "otlp_metrics": 3000, "record_batches": 1500, "traceparent": 2000,
              "attributes": 1500}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_smoke_finds_nothing_new(target):
    assert set(SMOKE_RUNS) == set(fuzz.TARGETS)
    logging.disable(logging.CRITICAL)
    try:
        seeds = fuzz.TARGETS[target].seeds()
        new = {}
        for data in _mutants(seeds, SMOKE_RUNS[target], random.Random(target)):
            sig = finding(target, data)
            if sig is not None and sig not in OPEN:
                new.setdefault(sig, data)
    finally:
        logging.disable(logging.NOTSET)
    assert not new, {sig: data[:200] for sig, data in new.items()}


def test_the_reader_replays_exactly_and_never_runs_dry():
    d = fuzz.Data(b"\x05abc")
    assert (d.int_in(0, 10), d.take(2), d.byte(), d.byte(), d.int_in(3, 3)) == (5, b"ab", ord("c"), 0, 3)
    values = [fuzz.Data(bytes([i]) * 40).value() for i in range(256)]
    assert values == [fuzz.Data(bytes([i]) * 40).value() for i in range(256)]
    assert {type(v) for v in values} >= {str, int, float, bool, type(None), bytes, list, tuple, dict}


def test_libfuzzer_logs_give_the_executions():
    assert fuzz.executed("#100\tpulse\n#164645\tDONE   cov: 1\nstat::number_of_executed_units: 164645\n") == 164645
    assert fuzz.executed("#4096\tpulse  cov: 3\n#8192\tpulse  cov: 3\n==12== ERROR: libFuzzer: timeout") == 8192


def test_workers_share_one_corpus_and_their_executions_add_up(tmp_path):
    run = fuzz.run_target("traceparent", 60, tmp_path, runs=400, workers=2)  # real atheris, two processes
    logs = {p.name: fuzz.executed(p.read_text()) for p in tmp_path.glob("libfuzzer-*.log")}
    assert set(logs) == {"libfuzzer-0-0.log", "libfuzzer-1-0.log"}
    assert all(n == 200 for n in logs.values()), logs  # each ran its share of the runs
    assert run.executions == 400 and run.findings == [] and run.artifacts == []


def test_a_finding_is_recorded_once_per_signature_across_the_processes_of_a_run(tmp_path):
    (tmp_path / "artifacts").mkdir()

    def check(data: bytes) -> None:
        raise ValueError(data)

    for _process in range(2):  # libFuzzer restarted after a timeout: a new process, the same findings file
        one_input = fuzz.guarded(check, tmp_path / "findings.jsonl", tmp_path / "artifacts")
        one_input(b"a")
        one_input(b"b")
    assert len((tmp_path / "findings.jsonl").read_text().splitlines()) == 1

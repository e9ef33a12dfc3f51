"""Every job dead-letters what it cannot parse or validate and keeps the valid records around it (issue #20
item 1): the shared builder (capped payload, size, hash, source), and the metrics and archive jobs' read paths
on poison batches of ``infersight.requests`` and ``infersight.pods``."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os

import pytest

from infersight.flink_jobs.archive.functions import ParseRecord
from infersight.flink_jobs.common.deadletter import dead_letter
from infersight.flink_jobs.metrics import core as metrics
from infersight.flink_jobs.normalize.core import normalize
from infersight.schemas.deadletter import FIELDS, MAX_PAYLOAD_BYTES, SOURCE_FIELDS
from infersight.schemas.records import dump_batch, gauge_problems, record_problems, validate
from infersight.schemas.topics import DLQ, OTLP_REQUESTS, PODS, REQUESTS
from tests.support.sample_requests import sample_records

WINDOW_MS = 10_000
POISON_BATCHES = [b"not json", b"\xff\xfe\x00", b"[1]", b'{"a":[]}', b'["ab", null]', b"5", b"[[]]"]


def _valid(n: int = 20) -> list[dict]:
    records = [r.to_dict() for r in sample_records(n, 1_780_000_000 * 10**9, 30.0)]
    assert all(not validate(r) for r in records)
    return records


def test_a_dead_letter_has_every_field_and_a_capped_payload_with_its_size_and_hash():
    raw = os.urandom(MAX_PAYLOAD_BYTES * 40)  # ~10 MiB: over the broker's 8 MiB record limit when copied whole
    letter = json.loads(dead_letter("infersight-test", "payload: bad", raw, topic="t", partition=2, offset=7))
    assert tuple(letter) == FIELDS and tuple(letter["source"]) == SOURCE_FIELDS
    assert base64.b64decode(letter["raw_base64"]) == raw[:MAX_PAYLOAD_BYTES] and letter["raw_truncated"]
    assert letter["raw_size"] == len(raw) and letter["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    assert letter["source"] == {"topic": "t", "partition": 2, "offset": 7} and letter["problems"] == ["payload: bad"]
    assert len(json.dumps(letter)) < 2 * MAX_PAYLOAD_BYTES < 8 << 20
    small = json.loads(dead_letter("j", "r", "ok", problems=["a", "b"]))
    assert base64.b64decode(small["raw_base64"]) == b"ok" and not small["raw_truncated"]
    assert small["problems"] == ["a", "b"]


def test_normalize_caps_an_undecodable_payload_over_the_record_limit():
    raw = os.urandom(9 << 20)
    [(topic, value, _)] = normalize(OTLP_REQUESTS.name, 1, 42, raw, 1_780_000_000 * 10**9)
    letter = json.loads(value)
    assert topic == DLQ.name and letter["job"] == "infersight-normalize" and letter["raw_size"] == len(raw)
    assert letter["source"] == {"topic": OTLP_REQUESTS.name, "partition": 1, "offset": 42}
    assert len(value) < 1 << 20


@pytest.mark.parametrize("poison", POISON_BATCHES)
def test_the_metrics_job_dead_letters_a_poison_batch_and_counts_the_batches_around_it(poison):
    letters: list[str] = []
    items = metrics.read_batch(poison.decode("utf-8", "replace"), REQUESTS.name, letters)
    rejected: list = []
    groups, late = metrics.group_batch(items, WINDOW_MS, -2**63, rejected)
    assert not groups and not late
    letters += metrics.dead_letters(rejected, REQUESTS.name)
    assert letters and all(json.loads(x)["job"] == "infersight-metrics" for x in letters)
    assert all(json.loads(x)["source"]["topic"] == REQUESTS.name for x in letters)
    valid = _valid()
    groups, _ = metrics.group_batch(metrics.read_batch(dump_batch(valid), REQUESTS.name, letters), WINDOW_MS, -2**63)
    assert sum(len(g) for g in groups.values()) == len(valid)


def test_the_metrics_job_keeps_the_valid_records_of_a_batch_with_bad_ones():
    valid = _valid()
    bad = [1, {"a": []}, {**valid[0], "engine": 5}, {**valid[0], "end_ns": 2**64 - 1},
           {**valid[0], "e2e_s": math.inf}, {**valid[0], "region": ""}, {**valid[0], "extra": 1}]
    rejected: list = []
    groups, late = metrics.group_batch([*valid[:10], *bad, *valid[10:]], WINDOW_MS, -2**63, rejected)
    assert sum(len(g) for g in groups.values()) == len(valid) and not late
    assert [item for item, _ in rejected] == bad
    letters = [json.loads(x) for x in metrics.dead_letters(rejected, REQUESTS.name)]
    assert [x["reason"].split(":")[0] for x in letters] == ["record", "trace_id", "engine", "end_ns", "e2e_s",
                                                            "region", "extra"]
    assert letters[2]["trace_id"] == valid[0]["trace_id"]
    assert json.loads(base64.b64decode(letters[2]["raw_base64"])) == bad[2]


def test_record_problems_agrees_with_validate():
    for record in _valid(200):
        assert record_problems(record) == [] == validate(record)
    for bad in ({**_valid(1)[0], "trace_id": "Z" * 32}, {**_valid(1)[0], "span_id": "x" * 16},
                {**_valid(1)[0], "tokens_in": 2**63}, {**_valid(1)[0], "model_version": None}):
        assert record_problems(bad) == validate(bad) != []


def _gauge(**over) -> dict:
    g = {"region": "us-east-1", "model": "m", "model_version": "", "track": "stable", "pod": "p0",
         "metric": "infersight.server.queue.depth", "value": 3.0, "time_ns": 1_780_000_000 * 10**9,
         "gpu_type": "H100", "gpu_count": 1, "engine": "vllm"}
    return {**g, **over}


def test_the_metrics_job_dead_letters_bad_pod_gauges_and_keeps_the_rest():
    from infersight.schemas.pipeline import POD_GAUGE_STATS

    metric = next(iter(POD_GAUGE_STATS))
    good = [_gauge(metric=metric, pod=f"p{i}") for i in range(5)]
    bad = [1, _gauge(metric=metric, value=None), _gauge(metric=metric, value=math.nan),
           _gauge(metric=metric, time_ns=2**64 - 1), _gauge(metric="nope"), _gauge(metric=metric, region="")]
    rejected: list = []
    groups, late = metrics.group_gauges([*good, *bad], WINDOW_MS, -2**63, rejected)
    assert [item for item, _ in rejected] == bad and not late
    assert {len(points) for points in groups.values()} == {len(good)}  # a deployment and its three roll-ups
    assert all(gauge_problems(g, POD_GAUGE_STATS) == [] for g in good)
    letters = [json.loads(x) for x in metrics.dead_letters(rejected, PODS.name)]
    assert all(x["source"]["topic"] == PODS.name and x["problems"] for x in letters)


@pytest.mark.parametrize("poison", POISON_BATCHES)
def test_the_archive_job_dead_letters_a_poison_batch(poison):
    parse = ParseRecord(60_000)
    out = list(parse.flat_map(poison.decode("utf-8", "replace")))
    assert out and all(key is None for key, _, _ in out)
    assert all(json.loads(letter)["job"] == "infersight-archive" for _, _, letter in out)
    valid = _valid()
    out = list(parse.flat_map(dump_batch([*valid, {"region": "r", "end_ns": 2**64 - 1}])))
    assert sum(1 for key, _, _ in out if key is None) == 1

"""Pods' gauges and cost rolled up per deployment, region and everywhere, and the unit cost that joins a
deployment's cost with its requests' output tokens, through the real normalize and metrics jobs (own jobs, own
regions: a module of its own, see ``test_pod_gauges_and_cost_roll_up_per_deployment_region_and_everywhere``)."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from infersight.schemas.records import RequestRecord
from infersight.schemas.topics import PODS, REQUESTS
from infersight.schemas.units import MS, NS
from tests.integration.diagnostics import vertex_metrics, watermarks
from tests.integration.pipeline_util import (
    Jobs,
    produce_pod_gauges,
    produce_requests,
    prom,
    prom_at,
    prom_value,
    wait_until,
)
from tests.support.sample_requests import sample_records

pytestmark = pytest.mark.integration
WINDOW_S = 10


@pytest.fixture(scope="module")
def jobs(stack):
    j = Jobs(stack)
    j.start()
    wait_until(j.running, 120, "the jobs to run")
    yield j
    j.stop_quietly()


def newest_ms(bootstrap: str, topic: str, since_ms: int) -> int:
    """The newest Kafka timestamp among ``topic``'s records stamped at or after ``since_ms`` (0: none)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"newest-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        starts = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in parts], timeout=10)
        newest = 0
        for tp in starts:
            high = consumer.get_watermark_offsets(tp, timeout=10)[1]
            if 0 <= tp.offset < high:
                consumer.assign([tp])
                # a transactional topic ends in a commit marker, never delivered: a short poll ends the partition
                while (msg := consumer.poll(2)) is not None and not msg.error():
                    newest = max(newest, msg.timestamp()[1])
                    if msg.offset() >= high - 1:
                        break
        return newest
    finally:
        consumer.close()


def batch(model: str, n: int, end_ns: int, seed: int) -> list[RequestRecord]:
    """``n`` records of ``model`` ending in the 8 s before ``end_ns``, in event-time order."""
    return sorted(sample_records(n, end_ns - 8 * NS, 8.0, seed=seed, models=(model,)), key=lambda r: r.end_ns)


def test_pod_gauges_and_cost_roll_up_per_deployment_region_and_everywhere(jobs, stack):
    """Pods' gauges and cost per deployment (region, model, version, track), per region over deployments and
    per deployment over regions, under their Prometheus names; unit cost joins a deployment's cost with its
    requests' output tokens."""
    bootstrap, prom_url = stack.layout.kafka_bootstrap, stack.layout.prometheus_url
    tag = uuid.uuid4().hex[:6]
    region, model, flush_region = f"pods-{tag}", f"pods-{tag}", f"pods-flush-{tag}"
    # The next window but one after now and after anything the jobs read (a module of its own, because after
    # test_flink_jobs' tests the jobs' watermarks stood ahead of now, and records placed after them closed their
    # windows only when the wall clock caught up: a source reader with nothing to read holds event time at the
    # wall clock less --quiet-s). Fresh jobs start at the module's start time, but by Kafka timestamp, which is
    # event time on the jobs' inputs: an earlier module's records stamped ahead of it are read too, and records
    # placed behind them would be a delayed region's catch-up windows, which unit cost leaves out.
    ahead = max(time.time_ns(), *(newest_ms(bootstrap, t.name, jobs.start_ms) * MS for t in (REQUESTS, PODS)))
    ahead += 2 * WINDOW_S * NS
    start = (ahead // (WINDOW_S * NS) + 1) * WINDOW_S * NS
    end_s = start / NS + WINDOW_S

    def pod(name: str, track: str, version: str, gpus: int, **gauges) -> dict:
        return {"resource": {A.CLOUD_REGION: region, A.K8S_POD_NAME: name, P.POD_MODEL_ATTRIBUTE: model,
                             A.MODEL_VERSION: version, A.DEPLOYMENT_TRACK: track, P.GPU_TYPE_ATTRIBUTE: "H100",
                             P.GPU_COUNT_ATTRIBUTE: gpus}, "gauges": gauges}

    produce_pod_gauges(bootstrap, [
        pod("a", "canary", "v2", 2, **{M.QUEUE_DEPTH: 3, M.HW_GPU_UTILIZATION: [0.5, 0.5]}),
        pod("b", "canary", "v2", 2, **{M.QUEUE_DEPTH: 4, M.HW_GPU_UTILIZATION: [1.0, 1.0]}),
        pod("c", "stable", "v1", 1, **{M.QUEUE_DEPTH: 5})], start + 2 * NS)
    canary = [dataclasses.replace(r, region=region, model_version="v2", track="canary")
              for r in batch(model, 40, start + 9 * NS, seed=31)]
    produce_requests(bootstrap, canary)
    tokens = sum(r.tokens_out for r in canary)

    at = [start + 3 * WINDOW_S * NS]

    def flush_then(check):
        def run():
            produce_requests(bootstrap, batch(f"flush-{tag}", 1, at[0], seed=1))
            produce_pod_gauges(bootstrap, [{"resource": {A.CLOUD_REGION: flush_region, A.K8S_POD_NAME: "f"},
                                            "gauges": {M.QUEUE_DEPTH: 0}}], at[0])
            at[0] += 5 * NS
            return check()
        return run

    usd_per_gpu_s = 3.0 / 3600  # the packaged pricing's default: an unknown region
    cost = {"canary": 4 * WINDOW_S * usd_per_gpu_s, "stable": 1 * WINDOW_S * usd_per_gpu_s}

    def series(name: str, **labels: str) -> str:
        selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{P.prom(name)}{{{selector}}}"

    def value(name: str, **labels: str) -> float | None:
        return prom_at(prom_url, series(name, **labels), end_s)

    depth = P.POD_GAUGES[M.QUEUE_DEPTH].name
    unit_cost = series(P.USD_PER_1M_OUTPUT_TOKENS, region=region, model=P.ALL_DEPLOYMENTS)

    metrics_job = jobs.ids["infersight.flink_jobs.metrics.job"]

    def what_there_is():  # CI keeps only this message: what did arrive, and how far the jobs' watermarks are
        names = prom(prom_url, f'count by (__name__) ({{region=~"{region}|{flush_region}"}})', end_s + 60)
        return {"window_end_s": end_s, "now_s": round(time.time()), "flushed_to_s": at[0] / NS,
                "series": sorted(f"{n['metric'].get('__name__', '')}:{n['value'][1]}" for n in names),
                "late_now": prom_value(prom_url, f'{P.prom(P.LATE_RECORDS)}{{region="{region}"}}'),
                "operators": {v: vertex_metrics(stack.layout.flink_rest_url, metrics_job, v,
                                                ("numRecordsIn", "numRecordsOut", "catchup_windows", "late_groups",
                                                 "late_unit_cost_tokens"))
                              for v in ("regional-windows", "pod-windows", "unit-cost")},
                "unit_cost_any_time": prom(prom_url, f'count by (__name__, model, track) '
                                                     f'(last_over_time({P.prom(P.USD_PER_1M_OUTPUT_TOKENS)}'
                                                     f'{{region="{region}"}}[1h]))', end_s + 600),
                "watermarks_s": {m.split(".")[-2]: watermarks(stack.layout.flink_rest_url, j)
                                 for m, j in jobs.ids.items()}}

    wait_until(flush_then(lambda: prom_at(prom_url, unit_cost, end_s + 60) is not None), 240,
               "the region's unit cost in Prometheus", every_s=5, last_of=what_there_is)
    ours = {"region": region, "model": model, "model_version": "v2", "track": "canary"}
    everyone = {"model": P.ALL_DEPLOYMENTS, "model_version": P.ALL_DEPLOYMENTS, "track": P.ALL_DEPLOYMENTS}
    assert value(depth, **ours, stat="sum") == 7 and value(depth, **ours, stat="max") == 4
    assert value(depth, region=region, model=model, track="stable", stat="sum") == 5
    assert value(depth, region=region, **everyone, stat="sum") == 12  # the region: every deployment
    assert value(depth, **{**ours, "region": P.GLOBAL_REGION}, stat="sum") == 7  # the deployment everywhere
    assert value(P.POD_GAUGES[M.HW_GPU_UTILIZATION].name, **ours, stat="mean") == pytest.approx(0.75)
    assert value(P.GPU_SECONDS, **ours) == 4 * WINDOW_S
    assert value(P.COST_USD, **ours) == pytest.approx(cost["canary"])
    assert value(P.IDLE_COST_USD, **ours) == pytest.approx(cost["canary"] / 2 * 0.5)  # pod a half idle, b busy
    assert value(P.COST_USD, region=region, **everyone) == pytest.approx(cost["canary"] + cost["stable"])
    assert value(P.USD_PER_1M_OUTPUT_TOKENS, **ours) == pytest.approx(cost["canary"] / tokens * 1e6)
    assert prom_at(prom_url, unit_cost, end_s) == pytest.approx((cost["canary"] + cost["stable"]) / tokens * 1e6)
    assert value(P.USD_PER_1M_OUTPUT_TOKENS, region=region, model=model, track="stable") is None  # no requests



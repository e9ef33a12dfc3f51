"""Region status, the pure judgement (stack/region_status.py) on a fake clock: delayed is not down.

A fake region writes a beacon every 2 s (the gateways' period) and requests when told; a fake link answers the
probe or not; a fake mirror copies the region's beacons to the global side or holds them. The judge sees only
what the service feeds it, at the times the test chooses."""

from __future__ import annotations

import pytest

from infersight.schemas import region_status as RS
from infersight.schemas.topics import GATEWAY_BEACONS, OTLP_REQUESTS
from infersight.stack.region_status import Beacon, Probe, RegionJudge, Thresholds
from infersight.stack.region_status_service import parse_offset_record, prometheus_text

EPOCH_MS = 1_800_000_000_000
REQ = (OTLP_REQUESTS.name, 0)
BEA = (GATEWAY_BEACONS.name, 0)


class World:
    """A region (gateway + regional Kafka), its link, the mirror, and the judge, stepped one second at a time."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.now = 0.0
        self.judge = RegionJudge("eu-west-1", self.now, thresholds)
        self.link = "up"          # up | cut
        self.gateways = True      # the gateway writes beacons
        self.mirroring = True     # MM2 copies (only while the link is up)
        self.mirror_data = True   # ... the data topics too (else only the beacons: a data topic trailing)
        self.rate = 50            # requests/s the gateway accepts (one record per request here)
        self.spans = 0.0
        self.beacons: list[tuple[int, float]] = []  # (timestamp ms, accepted spans), in the regional topic
        self.records = 0          # request records in the regional topic
        self.copied_beacons = 0
        self.copied_records = 0
        self.history: list[tuple[float, str]] = []

    def step(self, seconds: int = 1) -> None:
        for _ in range(seconds):
            self.now += 1
            if self.gateways:
                self.spans += self.rate
                self.records += self.rate
                if int(self.now) % 2 == 0:
                    self.beacons.append((EPOCH_MS + int(self.now * 1000), self.spans))
            if self.link == "up" and self.mirroring:
                for ts, spans in self.beacons[self.copied_beacons:]:
                    self.judge.beacon(Beacon("gw-1", ts, spans), self.now)
                self.copied_beacons = len(self.beacons)
                if self.mirror_data:
                    self.copied_records = self.records
                self.judge.mirrored_offset(REQ, self.copied_records)
                self.judge.mirrored_offset(BEA, self.copied_beacons)
            if self.link == "up":
                newest = self.beacons[-1][0] if self.beacons else None
                self.judge.probe_ok(Probe(self.now, len(self.beacons), newest,
                                          {REQ: self.records, BEA: len(self.beacons)}))
            else:
                self.judge.probe_failed(self.now, "timed out")
            record = self.judge.judge(self.now, EPOCH_MS + int(self.now * 1000))
            self.history.append((self.now, record["status"]))

    @property
    def status(self) -> str:
        return self.history[-1][1]

    def record(self) -> dict:
        return self.judge.judge(self.now, EPOCH_MS + int(self.now * 1000))

    def first(self, status: str, after: float) -> float:
        return next(t for t, s in self.history if t > after and s == status) - after

    def seen(self, after: float) -> set[str]:
        return {s for t, s in self.history if t > after}


def test_a_healthy_region_is_ok():
    w = World()
    w.step(40)
    r = w.record()
    assert r["status"] == RS.OK and r["link_up"] and r["cause"] == ""
    assert r["link_lag_s"] <= 2 and r["backlog_records"] == 0 and not r["backlog_estimated"]
    assert r["gateways"] == 1 and r["spans_per_s"] == pytest.approx(50)
    assert set(r) == set(RS.RECORD_FIELDS)


def test_a_cut_link_is_delayed_within_the_timeout_and_never_down_however_long():
    w = World()
    w.step(40)
    cut = w.now
    w.link = "cut"
    w.step(600)  # ten minutes
    assert w.first(RS.LINK_DELAYED, cut) <= Thresholds().link_timeout_s + 1 <= 15
    assert RS.GATEWAYS_DOWN not in w.seen(cut) and RS.NO_TRAFFIC not in w.seen(cut)
    r = w.record()
    assert r["cause"] == RS.CAUSE_LINK and not r["link_up"]
    assert r["link_lag_s"] == pytest.approx(600, abs=3)
    # the backlog while cut is the last measurement plus the region's write rate since: estimated, ~50 * 600
    assert r["backlog_estimated"] and r["backlog_records"] == pytest.approx(50 * 600, rel=0.1)


def test_a_cut_link_whose_gateways_also_die_stays_delayed_the_global_side_cannot_know():
    w = World()
    w.step(40)
    w.link = "cut"
    w.step(5)
    w.gateways = False
    w.step(120)
    assert w.status == RS.LINK_DELAYED and w.record()["cause"] == RS.CAUSE_LINK


def test_after_the_heal_it_is_delayed_while_the_mirror_drains_then_ok():
    w = World()
    w.step(40)
    w.link = "cut"
    w.step(60)
    w.link, w.mirroring = "up", False  # the link answers again; MM2 has not caught up yet
    healed = w.now
    w.step(3)
    r = w.record()
    assert r["status"] == RS.LINK_DELAYED and r["cause"] == RS.CAUSE_MIRROR and r["link_up"]
    assert r["link_lag_s"] >= 60 and r["backlog_records"] >= 50 * 60 and not r["backlog_estimated"]
    w.mirroring = True  # drained at once
    drained = w.now
    w.step(20)
    assert w.first(RS.OK, drained) <= 2
    assert RS.GATEWAYS_DOWN not in w.seen(healed)


def test_gateways_killed_with_the_link_up_is_down_within_30_s_and_never_delayed():
    w = World()
    w.step(40)
    killed = w.now
    w.gateways = False
    w.step(60)
    took = w.first(RS.GATEWAYS_DOWN, killed)
    assert took <= Thresholds().beacons_timeout_s + 2 <= 30
    assert RS.LINK_DELAYED not in w.seen(killed)
    assert w.record()["link_up"] and w.record()["cause"] == ""
    # and back: the restarted gateway's beacons grow the topic again
    w.gateways = True
    back = w.now
    w.step(10)
    assert w.first(RS.OK, back) <= 3


def test_a_regional_cluster_back_before_the_queued_beacons_is_not_down_but_dead_gateways_still_are():
    w = World()
    w.step(40)
    w.link, w.gateways = "cut", False  # the regional broker down: no answer, and nothing written (queued on disk)
    w.step(90)
    back = w.now
    w.link = "up"  # the broker answers; the gateways' retries land a few seconds later
    w.step(6)
    # nothing new in the region yet, so its newest beacon is no newer than the mirrored one: still delayed, not ok
    # (CI: a restarted regional broker read ok for a moment, then delayed by the mirror once the queue landed)
    assert {s for t, s in w.history if t > back} == {RS.LINK_DELAYED} and w.record()["cause"] == RS.CAUSE_LINK
    w.gateways = True
    w.step(20)
    assert RS.GATEWAYS_DOWN not in w.seen(back), w.history[-30:]
    assert w.status == RS.OK
    # gateways that died during the outage are still found, a beacons' timeout after the cluster is back
    w.link, w.gateways = "cut", False
    w.step(90)
    back = w.now
    w.link = "up"
    w.step(40)
    assert w.first(RS.GATEWAYS_DOWN, back) <= Thresholds().beacons_timeout_s + 2


def test_beacons_without_requests_are_no_traffic_then_ok_when_requests_come_back():
    w = World()
    w.step(40)
    w.rate = 0
    idle = w.now
    w.step(60)
    assert w.status == RS.NO_TRAFFIC
    took = w.first(RS.NO_TRAFFIC, idle)
    assert Thresholds().idle_s - 1 <= took <= Thresholds().idle_s + 3
    assert RS.GATEWAYS_DOWN not in w.seen(idle) and RS.LINK_DELAYED not in w.seen(idle)
    w.rate = 10
    back = w.now
    w.step(10)
    assert w.first(RS.OK, back) <= 3


def test_a_stalled_mirror_with_the_link_up_is_delayed_by_the_mirror_not_down():
    w = World()
    w.step(40)
    w.mirroring = False  # MM2 killed: the region answers, nothing is copied
    stalled = w.now
    w.step(30)
    assert w.first(RS.LINK_DELAYED, stalled) <= Thresholds().lag_bound_s + 3
    assert w.record()["cause"] == RS.CAUSE_MIRROR and RS.GATEWAYS_DOWN not in w.seen(stalled)


def test_a_short_blip_under_the_link_timeout_changes_nothing():
    w = World()
    w.step(40)
    blip = w.now
    w.link = "cut"
    w.step(3)
    w.link = "up"
    w.step(10)
    assert w.seen(blip) == {RS.OK}


def test_transitions_are_counted_and_since_marks_the_change():
    w = World()
    w.step(40)
    w.link = "cut"
    w.step(20)
    w.link = "up"
    w.step(20)
    assert [s for i, (_, s) in enumerate(w.history) if i == 0 or w.history[i - 1][1] != s] == \
        [RS.OK, RS.LINK_DELAYED, RS.OK]
    assert w.judge.changes == 2
    r = w.record()
    changed_at = next(t for t, s in reversed(w.history) if s == RS.LINK_DELAYED) + 1
    assert r["since_ms"] == EPOCH_MS + int(changed_at * 1000)


def test_a_region_never_reached_since_the_start_is_delayed_not_down():
    w = World()
    w.link = "cut"
    w.step(30)
    assert w.seen(0) <= {RS.OK, RS.LINK_DELAYED} and w.status == RS.LINK_DELAYED
    assert w.record()["backlog_records"] is None


def test_a_restarted_gateway_counter_is_not_read_as_a_negative_rate():
    j = RegionJudge("r", 0.0)
    for i, spans in enumerate([100, 200, 300, 5, 10, 20]):
        j.beacon(Beacon("gw", EPOCH_MS + 10_000 * i, spans), float(i))
    rate, busy = j.spans_per_s(5.0)
    assert busy and rate is not None and rate >= 0


def test_mm2_offset_records_parse_and_other_connectors_are_ignored():
    key = b'["MirrorSourceConnector",{"cluster":"eu-west-1","partition":2,"topic":"infersight.otlp.requests"}]'
    assert parse_offset_record(key, b'{"offset":41}') == ("eu-west-1", "infersight.otlp.requests", 2, 42)
    assert parse_offset_record(key, None) == ("eu-west-1", "infersight.otlp.requests", 2, None)
    assert parse_offset_record(b'["MirrorHeartbeatConnector",{"heartbeat":1}]', b'{"x":1}') is None
    assert parse_offset_record(b"not json", b"{}") is None


def test_prometheus_text_is_one_hot_per_region():
    w = World()
    w.step(40)
    text = prometheus_text([w.record()], {"eu-west-1": 0})
    lines = [ln for ln in text.splitlines() if ln.startswith(RS.STATUS + "{")]
    assert len(lines) == len(RS.STATUSES)
    assert [ln for ln in lines if ln.endswith(" 1")] == [f'{RS.STATUS}{{region="eu-west-1",status="ok"}} 1']
    assert f'{RS.LINK_UP}{{region="eu-west-1"}} 1' in text and f'{RS.BACKLOG_RECORDS}{{region="eu-west-1"}} 0' in text


def test_data_trailing_the_beacons_is_delayed_until_the_backlog_is_under_the_bound():
    w = World()
    w.step(40)
    w.mirror_data = False  # the beacons cross, the requests topic does not
    trailing = w.now
    w.step(30)
    r = w.record()
    assert r["status"] == RS.LINK_DELAYED and r["cause"] == RS.CAUSE_MIRROR and r["link_lag_s"] <= 2, r
    assert w.first(RS.LINK_DELAYED, trailing) <= Thresholds().lag_bound_s + 2
    w.mirror_data = True
    drained = w.now
    w.step(5)
    assert w.first(RS.OK, drained) <= 2 and RS.GATEWAYS_DOWN not in w.seen(trailing)


def test_a_beacon_decodes_to_the_otlp_receivers_accepted_spans_and_the_queues():
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from infersight.stack.region_status_service import decode_beacon

    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in (("service.instance.id", "gw-7"), ("cloud.region", "eu-west-1")):
        a = rm.resource.attributes.add()
        a.key, a.value.string_value = k, v
    metrics = rm.scope_metrics.add().metrics
    accepted = metrics.add()
    accepted.name = "otelcol_receiver_accepted_spans"
    for receiver, n in (("otlp", 120), ("otlp", 30), ("otlp/beacon", 999)):  # grpc and http; not the beacons'
        p = accepted.sum.data_points.add()
        p.as_int = n
        attr = p.attributes.add()
        attr.key, attr.value.string_value = "receiver", receiver
    queue = metrics.add()
    queue.name = "otelcol_exporter_queue_size"
    for n in (3, 4):
        queue.gauge.data_points.add().as_int = n
    [b] = decode_beacon(req.SerializeToString(), EPOCH_MS)
    assert b == Beacon("gw-7", EPOCH_MS, 150.0, 7.0)


def test_gateways_gone_for_long_are_forgotten():
    j = RegionJudge("r", 0.0)
    j.beacon(Beacon("old", EPOCH_MS, 1), 0.0)
    j.beacon(Beacon("new", EPOCH_MS + 700_000, 1), 700.0)
    assert set(j.beacons) == {"new"}


class RefusingProducer:
    """A producer the global cluster refuses ``refusals`` times (the status topic not there yet), then accepts."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.sent = refusals, []

    def produce(self, topic: str, value: bytes, key: bytes) -> None:
        from confluent_kafka import KafkaError, KafkaException

        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Unknown topic"))
        self.sent.append(key.decode())


def test_a_refused_status_record_is_published_on_the_next_turn_and_the_judge_goes_on():
    from infersight.stack.region_status_service import RegionStatusService

    logged: list[str] = []
    service = RegionStatusService("127.0.0.1:1", {"eu-west-1": "127.0.0.1:2", "us-east-1": "127.0.0.1:3"},
                                  log=logged.append)
    producer, published = RefusingProducer(refusals=2), {}
    for _ in range(2):
        service.judge_and_publish(producer, published)
    assert producer.sent == [] and published == {} and service.publish_error
    assert len([m for m in logged if "publishing" in m]) == 1  # said once per failure streak, not per turn
    service.judge_and_publish(producer, published)
    assert sorted(producer.sent) == ["eu-west-1", "us-east-1"] and set(published) == set(producer.sent)
    assert service.publish_error is None and len(service.records()) == 2


def test_health_is_503_naming_a_worker_thread_that_died():
    import json
    import threading
    import urllib.error
    import urllib.request
    from http.server import ThreadingHTTPServer

    from infersight.stack.region_status_service import RegionStatusService, handler_for

    service = RegionStatusService("127.0.0.1:1", {"eu-west-1": "127.0.0.1:2"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(service))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        alive = threading.Thread(target=service.stop.wait, name="judge", daemon=True)
        alive.start()
        service.threads = [alive]
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.status == 200
        dead = threading.Thread(target=lambda: None, name="read")
        dead.start()
        dead.join()
        service.threads.append(dead)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 503 and json.loads(err.value.read())["dead_threads"] == ["read"]
    finally:
        service.stop.set()
        server.shutdown()

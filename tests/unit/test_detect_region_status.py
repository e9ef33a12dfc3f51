"""The detect engine and the region status (flink_jobs/detect/regions.py, issue #25 item 2): a silence of a region
whose link is delayed is a notice, not an outage; gateways down is an outage that says so; no traffic is a notice;
status changes while silent; the delayed windows' catch-up burst raises nothing; bad status records dead-letter."""

from __future__ import annotations

import json

import numpy as np

from infersight.flink_jobs.detect.core import Engine
from infersight.flink_jobs.detect.regions import MAX_REGIONS, RegionStatuses, newer_status
from infersight.flink_jobs.detect.stream import DetectState, parse_status
from infersight.schemas import region_status as RS
from infersight.schemas.detection import NOTICE_FIELDS, SILENT

REGIONS = ("ap-southeast-1", "eu-west-1", "us-east-1")
QUIET = "eu-west-1"
T0 = 1_796_500_000.0
CUT, HEAL = 60, 75  # window indexes: eu-west-1 sends nothing from CUT until HEAL


def rows_of(i: int, region: str, rng: np.random.Generator, rate_factor: float = 1.0) -> list[tuple]:
    t = T0 + 10.0 * i
    signals = {"request_rate": 100.0 * rate_factor + rng.normal(0, 2), "error_ratio": abs(rng.normal(0.001, 0.0005)),
               "ttft_p50": 0.1 + rng.normal(0, 0.002), "tokens_per_s": 5000.0 * rate_factor + rng.normal(0, 50)}
    return [(t, region, "llama", "stable@v1", s, float(v)) for s, v in sorted(signals.items())]


def status(state: str, at_ms: int = 1, region: str = QUIET, **fields) -> dict:
    cause = RS.CAUSE_LINK if state == RS.LINK_DELAYED else ""
    return {"region": region, "status": state, "at_ms": at_ms, "since_ms": at_ms, "cause": cause, "link_up": False,
            "link_lag_s": 42.0, "backlog_records": 1200, "backlog_estimated": True, "gateways": 2,
            "spans_per_s": 30.0, "queue_size": 0, "reason": "test", **fields}


def run(statuses: dict[int, dict] | None = None, windows: int = 130, heal: int | None = HEAL,
        late_at: int | None = None, engine: Engine | None = None) -> tuple[list[dict], Engine]:
    """Every region sends each window, except eu-west-1 from CUT to ``heal`` (never with None). ``statuses``: a
    status record handed to the engine before window i. ``late_at``: the missing windows arrive late, in a burst
    just before window ``late_at`` (as a delayed region's windows would: older than the engine's newest)."""
    rng = np.random.default_rng(5)
    engine = engine or Engine()
    events: list[dict] = []
    held_back: list[tuple] = []
    for i in range(windows):
        if statuses and i in statuses:
            engine.region_status(statuses[i])
        if late_at is not None and i == late_at:
            for row in sorted(held_back):
                events += engine.observe(*row)
        for region in REGIONS:
            rows = rows_of(i, region, rng)
            if region == QUIET and i >= CUT and (heal is None or i < heal):
                held_back += rows
                continue
            for row in rows:
                events += engine.observe(*row)
    return events, engine


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def test_without_a_status_the_silent_region_is_an_incident_as_before():
    events, _ = run()
    silent = [e for e in of_type(events, "anomaly") if e["signal"] == SILENT]
    assert {e["region"] for e in silent} == {QUIET}
    opened = [e for e in of_type(events, "incident") if e["event"] == "open"]
    assert len(opened) == 1 and opened[0]["kind"] == "silent" and opened[0]["regions"] == [QUIET]
    assert not of_type(events, "notice")


def test_an_ok_status_changes_nothing():
    assert run({0: status(RS.OK), 10: status(RS.OK, region="us-east-1")})[0] == run()[0]


def test_a_delayed_region_is_a_notice_not_an_outage():
    events, engine = run({CUT - 2: status(RS.LINK_DELAYED)})
    assert not of_type(events, "anomaly") and not of_type(events, "incident")
    start, end = of_type(events, "notice")
    assert set(start) == set(NOTICE_FIELDS)
    assert (start["event"], start["kind"], start["region"], start["status"]) == ("start", "delayed", QUIET,
                                                                                   RS.LINK_DELAYED)
    assert start["summary"].startswith("telemetry from eu-west-1 delayed (link), lag 42 s, backlog 1200 records")
    assert (start["link_lag_s"], start["backlog_records"], start["backlog_estimated"]) == (42.0, 1200, True)
    assert start["cause"] == RS.CAUSE_LINK and start["series"] == 1 and start["models"] == ["llama"]
    assert end["event"] == "end" and end["resumed"] == 1 and "caught up" in end["summary"]
    assert end["window_end"] == T0 + 10.0 * HEAL  # at the close of the first window it sent again
    assert engine.counts["silence_explained"] == 1 and not engine.regions.held and not engine.regions.notices


def test_gateways_down_stays_an_outage_and_names_its_cause():
    events, _ = run({CUT - 2: status(RS.GATEWAYS_DOWN)})
    opened = [e for e in of_type(events, "incident") if e["event"] == "open"]
    assert len(opened) == 1
    assert opened[0]["kind"] == "outage" and opened[0]["regions"] == [QUIET]
    assert opened[0]["likely_cause"] == "gateways down in eu-west-1"
    assert "likely cause: gateways down in eu-west-1" in opened[0]["summary"]
    assert not of_type(events, "notice")


def test_no_traffic_is_a_notice_not_an_outage():
    events, _ = run({CUT - 2: status(RS.NO_TRAFFIC)})
    assert not of_type(events, "incident") and not of_type(events, "anomaly")
    start, end = of_type(events, "notice")
    assert start["kind"] == "no_traffic" and "no traffic" in start["summary"] and end["resumed"] == 1


def test_the_status_turning_ok_while_the_region_stays_silent_makes_it_silent_after_the_wait():
    ok_at = CUT + 10
    events, engine = run({CUT - 2: status(RS.LINK_DELAYED), ok_at: status(RS.OK, at_ms=2)}, heal=None)
    silent = [e for e in of_type(events, "anomaly") if e["signal"] == SILENT]
    assert len(silent) == 1
    # the engine learnt of ok before window ok_at; it waits silent_windows windows for the delayed data
    waited = silent[0]["window_end"] - (T0 + 10.0 * (ok_at - 1))
    assert waited == engine.params.silent_windows * 10.0
    assert [e["kind"] for e in of_type(events, "incident") if e["event"] == "open"] == ["silent"]
    end = of_type(events, "notice")[-1]
    assert end["event"] == "end" and end["resumed"] == 0 and "still silent" in end["summary"]


def test_the_status_turning_gateways_down_while_held_is_an_outage_at_once():
    down_at = CUT + 10
    events, _ = run({CUT - 2: status(RS.LINK_DELAYED), down_at: status(RS.GATEWAYS_DOWN, at_ms=2)}, heal=None)
    (silent,) = [e for e in of_type(events, "anomaly") if e["signal"] == SILENT]
    assert silent["window_end"] == T0 + 10.0 * (down_at - 1)  # the first window closed after the news
    (opened,) = [e for e in of_type(events, "incident") if e["event"] == "open"]
    assert opened["kind"] == "outage" and opened["likely_cause"] == "gateways down in eu-west-1"


def test_a_silence_found_before_the_delay_was_known_is_held_and_its_incident_resolves():
    events, engine = run({CUT + 6: status(RS.LINK_DELAYED)}, heal=None, windows=CUT + 60)
    kinds = [(e["type"], e.get("event")) for e in events]
    assert kinds.count(("anomaly", None)) == 1 and ("incident", "open") in kinds
    assert ("notice", "start") in kinds and ("incident", "resolve") in kinds  # no longer active: resolves
    assert kinds.index(("notice", "start")) < kinds.index(("incident", "resolve"))
    assert not engine.silent and list(engine.regions.held) == [f"{QUIET}|llama|stable@v1"]


def test_an_incident_open_before_gateways_down_was_known_is_updated_with_the_cause():
    events, _ = run({CUT + 6: status(RS.GATEWAYS_DOWN)}, heal=None, windows=CUT + 10)
    incidents = of_type(events, "incident")
    assert [e["event"] for e in incidents] == ["open", "update"]
    assert incidents[1]["kind"] == "outage" and incidents[1]["likely_cause"] == "gateways down in eu-west-1"


def test_the_delayed_windows_arriving_late_in_a_burst_raise_nothing():
    # before the region's first window after the heal (its records keep their order: one partition per series),
    # or, in case, after it or a few windows later
    for late_at in (HEAL, HEAL + 1, HEAL + 3):
        events, engine = run({CUT - 2: status(RS.LINK_DELAYED), HEAL: status(RS.OK, at_ms=2)}, late_at=late_at)
        assert not of_type(events, "anomaly") and not of_type(events, "incident"), late_at
        assert [e["event"] for e in of_type(events, "notice")] == ["start", "end"]
        assert engine.counts["late_row"] > 0
        detector = engine.detectors[f"{QUIET}|llama|stable@v1|request_rate"]
        assert not detector.active
        # in order, the late windows are learnt as if on time; behind a newer one, skipped and counted
        assert detector.n_out_of_order == (0 if late_at == HEAL else HEAL - CUT), late_at


def test_a_burst_of_only_old_windows_counts_as_news_until_the_region_is_current_again():
    """The late windows can come a little before the region's current ones: the series is not called silent
    again meanwhile (silent_windows after the burst at the earliest), although its newest window is old."""
    rng = np.random.default_rng(5)
    engine = Engine()
    events: list[dict] = []
    burst_at, current_from = HEAL + 2, HEAL + 4  # windows HEAL..HEAL+3 of eu-west-1 never come
    held_back: list[tuple] = []
    for i in range(HEAL + 40):
        if i == CUT - 2:
            engine.region_status(status(RS.LINK_DELAYED))
        if i == HEAL:
            engine.region_status(status(RS.OK, at_ms=2))
        if i == burst_at:
            for row in sorted(held_back):
                events += engine.observe(*row)
        for region in REGIONS:
            rows = rows_of(i, region, rng)
            if region == QUIET and CUT <= i < current_from:
                held_back += rows if i < HEAL else []
                continue
            for row in rows:
                events += engine.observe(*row)
    assert not of_type(events, "anomaly") and not of_type(events, "incident")
    assert [e["event"] for e in of_type(events, "notice")] == ["start", "end"]


def test_a_burst_of_late_windows_newest_first_is_skipped_not_alarming():
    rng = np.random.default_rng(9)
    events, engine = run({CUT - 2: status(RS.LINK_DELAYED)}, heal=HEAL)
    t_now = engine.current_t
    late = [row for i in range(HEAL - 5, HEAL) for row in rows_of(i, QUIET, rng)]
    for row in sorted(late, reverse=True):
        events += engine.observe(*row)
    for region in REGIONS:
        for row in rows_of(int((t_now - T0) / 10) + 1, region, rng):
            events += engine.observe(*row)
    assert not of_type(events, "anomaly") and not of_type(events, "incident")


def cut_mid_window(with_status: bool) -> tuple[list[dict], Engine]:
    """eu-west-1's link cut mid-window CUT: that window holds 40 % of its traffic, the next ones nothing."""
    rng = np.random.default_rng(5)
    engine = Engine()
    events: list[dict] = []
    for i in range(CUT + 20):
        if i == CUT - 2 and with_status:
            engine.region_status(status(RS.LINK_DELAYED))
        for region in REGIONS:
            if region == QUIET and i > CUT:
                continue
            for row in rows_of(i, region, rng, 0.4 if region == QUIET and i == CUT else 1.0):
                events += engine.observe(*row)
    return events, engine


def test_a_partial_window_of_a_delayed_region_is_no_outage():
    events, engine = cut_mid_window(with_status=True)
    assert not of_type(events, "anomaly") and not of_type(events, "incident")
    assert engine.counts["traffic_fall_explained"] >= 1
    rate = engine.detectors[f"{QUIET}|llama|stable@v1|request_rate"]
    assert rate.active and not rate.reported  # no anomaly score shown for it either
    events, _ = cut_mid_window(with_status=False)  # without the status: a failing region
    assert any(e["signal"] == "request_rate" and e["direction"] == "down" for e in of_type(events, "anomaly"))
    assert [e["kind"] for e in of_type(events, "incident") if e["event"] == "open"] == ["outage"]


def test_the_engine_state_round_trips_mid_delay():
    statuses = {CUT - 2: status(RS.LINK_DELAYED), HEAL + 2: status(RS.OK, at_ms=2)}
    whole, _ = run(statuses)
    first, engine = run(statuses, windows=CUT + 5)
    restored = Engine.from_state(json.loads(json.dumps(engine.to_state())))
    assert restored.regions.held and restored.regions.notices
    # continue the same rows on the restored engine: rerun the tail with a fresh generator in step
    rng = np.random.default_rng(5)
    rest: list[dict] = []
    for i in range(130):
        if i in statuses and i >= CUT + 5:
            restored.region_status(statuses[i])
        for region in REGIONS:
            rows = rows_of(i, region, rng)
            if i < CUT + 5 or (region == QUIET and CUT <= i < HEAL):
                continue
            for row in rows:
                rest += restored.observe(*row)
    assert first + rest == whole


def test_the_latest_status_per_region_wins():
    regions = RegionStatuses()
    assert regions.apply(status(RS.LINK_DELAYED, at_ms=20), 1.0)
    assert not regions.apply(status(RS.OK, at_ms=10), 2.0)  # an older record (the compacted topic's replay)
    assert regions.status(QUIET) == RS.LINK_DELAYED and regions.status("elsewhere") == RS.OK
    assert regions.apply(status(RS.LINK_DELAYED, at_ms=30, link_lag_s=50.0), 3.0)
    assert regions.statuses[QUIET]["seen_t"] == 1.0 and regions.statuses[QUIET]["link_lag_s"] == 50.0
    assert newer_status(None, status(RS.OK)) and not newer_status(status(RS.OK, at_ms=5), status(RS.OK, at_ms=4))
    full = RegionStatuses(statuses={f"r{i}": {"status": RS.OK, "at_ms": 0} for i in range(MAX_REGIONS)})
    assert not full.apply(status(RS.OK, region="one-too-many"), 0.0) and full.refused == 1


def test_bad_status_records_become_dead_letters_with_their_reason():
    good = status(RS.LINK_DELAYED)
    cases = [("{", "not_json"), ("[]", "region_status_not_an_object"),
             (json.dumps({k: v for k, v in good.items() if k != "region"}), "region_status_missing_region"),
             (json.dumps({**good, "region": ""}), "region_status_bad_region"),
             (json.dumps({**good, "status": "on_fire"}), "region_status_unknown_status"),
             (json.dumps({**good, "at_ms": "soon"}), "region_status_bad_at_ms"),
             (json.dumps({**good, "at_ms": True}), "region_status_bad_at_ms"),
             (json.dumps({**good, "link_lag_s": -1}), "region_status_bad_link_lag_s"),
             ('{"region": "r", "status": "ok", "at_ms": 1, "link_lag_s": Infinity}', "region_status_bad_link_lag_s"),
             (json.dumps({**good, "backlog_records": "many"}), "region_status_bad_backlog_records")]
    for raw, reason in cases:
        record, letter = parse_status(raw)
        assert record is None and json.loads(letter)["reason"] == reason, raw
    record, letter = parse_status(json.dumps({**good, "backlog_records": None}))  # unknown backlog: fine
    assert letter is None and record["backlog_records"] is None


def test_the_job_state_hands_the_statuses_to_the_engine_before_its_windows():
    state = DetectState()
    state.region_statuses([status(RS.LINK_DELAYED)])
    assert state.engine.regions.status(QUIET) == RS.LINK_DELAYED
    restored = DetectState(state.to_state())
    assert restored.engine.regions.status(QUIET) == RS.LINK_DELAYED


def test_the_series_held_under_a_notice_are_a_gauge_that_reads_zero_once_they_resumed():
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from infersight.schemas import pipeline as P

    def held(metrics: bytes | None) -> dict[tuple[str, str], float]:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(metrics or b"")
        return {(attrs["region"], attrs["kind"]): p.as_int or p.as_double
                for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == P.HELD_SERIES for p in m.gauge.data_points
                for attrs in [{a.key: a.value.string_value for a in p.attributes}]}

    state = DetectState()
    rng = np.random.default_rng(5)
    seen = []
    for i in range(HEAL + 5):
        if i == CUT - 2:
            state.region_statuses([status(RS.LINK_DELAYED)])
        rows = [dict(zip(("window_end", "region", "model", "track", "signal", "value"), row, strict=True))
                for region in REGIONS for row in rows_of(i, region, rng)
                if not (region == QUIET and CUT <= i < HEAL)]
        seen.append(held(state.windows(rows)[1]))
    during = [h for h in seen[CUT:HEAL] if h]
    assert during and all(h == {(QUIET, "delayed"): 1} for h in during[1:]), during  # its one series, held
    assert seen[-1] == {(QUIET, "delayed"): 0}  # caught up: 0, not its last value
    assert not any(seen[:CUT - 2])  # nothing before the delay
    assert DetectState(state.to_state()).notice_kinds == [[QUIET, "delayed"]]

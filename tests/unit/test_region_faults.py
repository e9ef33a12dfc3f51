"""The multi-region fault bench's pieces that need no stack: the flap schedule, the status figures and the fault
table (bench/region_faults.py, tests/support/fault_injection.py)."""

from __future__ import annotations

from infersight.schemas import region_status as RS
from tests.support.region_status import StatusWatch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += max(0.0, s)


def test_a_flap_cuts_and_heals_on_a_fixed_schedule_and_ends_healed(monkeypatch):
    from infersight.stack import multiregion
    from tests.support import fault_injection

    clock, actions = FakeClock(), []
    monkeypatch.setattr(fault_injection.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(fault_injection.time, "sleep", clock.sleep)

    def link(layout, region, action):
        clock.now += 0.3  # a slow control call must not stretch the schedule
        actions.append((round(clock.now - 100.0), action))

    monkeypatch.setattr(multiregion, "link", link)
    cuts = fault_injection.flap_link(None, "us-east-1", every_s=10, for_s=60)
    assert cuts == 3
    assert actions == [(0, "cut"), (10, "heal"), (20, "cut"), (30, "heal"), (40, "cut"), (50, "heal"), (60, "heal")]


def watch_of(rows: list[tuple[float, str]], region: str = "r1") -> StatusWatch:
    watch = StatusWatch(layout=None)
    watch.samples = [(t, {region: {"status": s}}) for t, s in rows]
    return watch


def test_status_figures_time_the_expected_status_the_contradicting_ones_and_ok_after_the_heal():
    from bench.region_faults import status_figures

    watch = watch_of([(0, RS.OK), (5, RS.OK), (7, RS.LINK_DELAYED), (20, RS.GATEWAYS_DOWN), (23, RS.LINK_DELAYED),
                      (60, RS.LINK_DELAYED), (64, RS.OK), (70, RS.OK)])
    out = status_figures(watch, ["r1"], fault_at=1.0, until=70.0, healed=61.0, expect=RS.LINK_DELAYED,
                         contradicts=frozenset({RS.GATEWAYS_DOWN, RS.NO_TRAFFIC}))
    assert out["status_detected_s"] == 6.0
    assert out["wrong_status"] == 3.0
    assert out["status_ok_after_heal_s"] == 3.0
    assert out["status_transitions"]["r1"][0] == (4.0, RS.OK)


def test_status_figures_leave_out_what_never_came():
    from bench.region_faults import status_figures

    out = status_figures(watch_of([(0, RS.OK), (10, RS.OK)]), ["r1"], 0.0, 10.0, 5.0, RS.GATEWAYS_DOWN,
                         frozenset({RS.LINK_DELAYED}))
    assert "status_detected_s" not in out and out["wrong_status"] == 0.0
    assert status_figures(watch_of([]), ["r1"], 0.0, 10.0, 5.0, RS.LINK_DELAYED, frozenset()) == {}


def test_every_fault_of_the_issue_is_in_the_table_and_runs_in_the_documented_order():
    from bench.region_faults import FAULTS, faults

    assert set(FAULTS) == set(faults()) == {"link_cut_60s", "link_cut_300s", "link_reset", "link_flap", "mm2_kill9",
                                            "global_kafka_kill9", "regional_kafka_down", "gateways_down"}
    table = faults()
    assert table["gateways_down"].expect == RS.GATEWAYS_DOWN
    assert table["gateways_down"].contradicts == {RS.LINK_DELAYED}
    assert {n for n, f in table.items() if f.every_region} == {"mm2_kill9", "global_kafka_kill9"}
    assert all(f.expect == RS.LINK_DELAYED and RS.GATEWAYS_DOWN in f.contradicts
               for n, f in table.items() if n != "gateways_down")

"""What the engine knows of each region's status (``infersight.region_status``, ``schemas/region_status.py``):
"delayed is not down" (issue #25 item 2). Pure, plain state, like ``core``.

From the global side a cut link and a dead region look the same: their series stop. The region status service
tells them apart; this class keeps its latest word per region and the series whose silence it explains:

- ``link_delayed`` or ``no_traffic``: a series falling quiet is *held*, not silent: no anomaly, no incident, one
  non-paging notice per region (``start`` when the first falls quiet, ``end`` when the last has resumed);
- ``gateways_down``: a silence stays a silence, and its incident names "gateways down" as the likely cause;
- ``ok`` or no record (the single-region topology): as without this class.

A held series whose region's status stops explaining it is released: at once when its gateways are down,
otherwise after ``wait_s`` of the new status (the delayed windows' time to arrive); released, it is silent.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from infersight.schemas import region_status as RS

# the notice kind of a status that explains a silence
EXPLAINED_BY = {RS.LINK_DELAYED: "delayed", RS.NO_TRAFFIC: "no_traffic"}
# the likely cause an incident of a region in this status names
CAUSE_OF = {RS.GATEWAYS_DOWN: "gateways down"}
# the fields of a status record the engine keeps (and a notice carries)
KEPT = ("status", "cause", "at_ms", "link_lag_s", "backlog_records", "backlog_estimated")
MAX_REGIONS = 10_000  # bounds the state against a flood of made-up region names


def newer_status(held: dict[str, Any] | None, record: dict[str, Any]) -> bool:
    """Whether ``record`` replaces the region's ``held`` record: the latest per region wins (``at_ms``), so a
    replay of the compacted topic's older records changes nothing."""
    return held is None or record["at_ms"] >= held["at_ms"]


def region_of(series_key: str) -> str:
    return series_key.split("|", 1)[0]


@dataclass
class RegionStatuses:
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # region -> KEPT + seen_t (engine time)
    held: dict[str, float] = field(default_factory=dict)  # series key -> window it fell quiet, explained
    notices: dict[str, dict[str, Any]] = field(default_factory=dict)  # region -> its open notice
    refused: int = 0  # records refused by the region bound

    # ---- the status
    def apply(self, record: dict[str, Any], t: float | None) -> bool:
        """Take a valid status record (``RS.record_problem`` is None) seen at engine time ``t``, unless an
        older one than the region's (``newer_status``)."""
        region = record["region"]
        old = self.statuses.get(region)
        if not newer_status(old, record):
            return False
        if old is None and len(self.statuses) >= MAX_REGIONS:
            self.refused += 1
            return False
        kept = {k: record.get(k) for k in KEPT}
        # seen_t: when the engine learnt of this status, the start of a released series' wait
        kept["seen_t"] = old["seen_t"] if old is not None and old["status"] == record["status"] else t
        self.statuses[region] = kept
        return True

    def status(self, region: str) -> str:
        s = self.statuses.get(region)
        return s["status"] if s is not None else RS.OK

    def explains(self, region: str) -> str | None:
        """The notice kind when the region's status explains its series' silence, else None."""
        return EXPLAINED_BY.get(self.status(region))

    def causes(self) -> dict[str, str]:
        """Region -> the likely cause its status gives an incident (gateways down)."""
        return {r: CAUSE_OF[s["status"]] for r, s in sorted(self.statuses.items()) if s["status"] in CAUSE_OF}

    # ---- the series it explains
    def hold(self, series_key: str, model: str, t: float) -> None:
        region = region_of(series_key)
        self.held[series_key] = t
        notice = self.notices.get(region)
        if notice is None:
            notice = self.notices[region] = {"kind": self.explains(region), "start": t, "series": 0, "models": [],
                                             "resumed": 0, "announced": False}
        notice["series"] += 1
        if model not in notice["models"]:
            notice["models"] = sorted([*notice["models"], model])

    def resume(self, series_key: str) -> None:
        """The series sent again (its delayed windows arrived, or its traffic came back)."""
        if self.held.pop(series_key, None) is not None:
            notice = self.notices.get(region_of(series_key))
            if notice is not None:
                notice["resumed"] += 1

    def forget(self, series_key: str) -> None:
        self.held.pop(series_key, None)

    def to_release(self, t: float, wait_s: float) -> list[str]:
        """Held series whose region's status no longer explains their silence and has had its time to (see the
        module's docstring); the caller calls them silent."""
        due = []
        for series_key in sorted(self.held):
            region = region_of(series_key)
            if self.explains(region):
                continue
            s = self.statuses.get(region)
            if s is None:  # cannot happen for a held series; treated like ok
                due.append(series_key)
                continue
            if s["seen_t"] is None:  # learnt before the engine's first window
                s["seen_t"] = t
            if s["status"] in CAUSE_OF or t - s["seen_t"] >= wait_s:
                due.append(series_key)
        for series_key in due:
            del self.held[series_key]
        return due

    # ---- the notices
    def notice_events(self, t: float) -> list[dict[str, Any]]:
        """The notices to publish at the close of window ``t``: a start for each region whose first series fell
        quiet, an end for each whose held series are all back (or released)."""
        events = []
        for region in sorted(self.notices):
            notice = self.notices[region]
            if not notice["announced"]:
                notice["announced"] = True
                events.append(self._event(region, notice, "start", t))
            if not any(region_of(k) == region for k in self.held):
                events.append(self._event(region, notice, "end", t))
                del self.notices[region]
        return events

    def _event(self, region: str, notice: dict[str, Any], event: str, t: float) -> dict[str, Any]:
        s = self.statuses.get(region) or {}
        return {"type": "notice", "event": event, "kind": notice["kind"], "region": region, "window_end": t,
                "start": notice["start"], "end": t if event == "end" else None, "status": s.get("status", RS.OK),
                "cause": s.get("cause") or "", "link_lag_s": s.get("link_lag_s"),
                "backlog_records": s.get("backlog_records"), "backlog_estimated": bool(s.get("backlog_estimated")),
                "series": notice["series"], "models": list(notice["models"]), "resumed": notice["resumed"],
                "summary": summary(region, notice, s, event, t)}

    def to_state(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> RegionStatuses:
        return cls(**copy.deepcopy(state)) if state else cls()


def summary(region: str, notice: dict[str, Any], status: dict[str, Any], event: str, t: float) -> str:
    """One line for people: 'telemetry from eu-west-1 delayed (link), lag 42 s, backlog 1200 records'."""
    n, kind = notice["series"], notice["kind"]
    if event == "end":
        took = f"after {t - notice['start']:.0f} s"
        if notice["resumed"] >= n:
            return (f"telemetry from {region} caught up: {n} series resumed {took}" if kind == "delayed" else
                    f"traffic back in {region}: {n} series resumed {took}")
        return (f"{region}: {n - notice['resumed']} of {n} series still silent {took}, its status now "
                f"{status.get('status', RS.OK)}: called silent")
    if kind == "no_traffic":
        return f"{region} has no traffic (region status no_traffic): {n} series stopped sending, not an outage"
    head = f"telemetry from {region} delayed ({status.get('cause') or 'link'})"
    lag = status.get("link_lag_s")
    if lag is not None:
        head += f", lag {lag:.0f} s"
    backlog = status.get("backlog_records")
    if backlog is not None:
        head += f", backlog {backlog} records" + (" (estimated)" if status.get("backlog_estimated") else "")
    return f"{head}: {n} series waiting, not an outage"

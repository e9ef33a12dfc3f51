"""Region status, the contract: "delayed is not down" (issue #25 item 2).

Each region's gateways write a beacon, their own telemetry exported over OTLP every ``BEACON_INTERVAL_S``
(``collectors/gateway.yaml``: the collector's internal metrics, a periodic reader into its own ``otlp/beacon``
receiver, a pipeline to ``infersight.otlp.beacons``), into the regional Kafka, mirrored like the rest. On the
global side the region status service (``stack/region_status.py``) judges each region from the mirrored
beacons and a probe of the regional cluster through its link, and publishes:

- the stream ``infersight.region_status`` (compacted, keyed by region): one JSON record per change and a
  refresh every few seconds, with the fields of ``RECORD_FIELDS``;
- Prometheus series (the service's ``/metrics``, scraped as job ``REGION_STATUS_JOB``), per ``region``:
  ``STATUS`` (1 for the current status, 0 for the others, label ``status``), ``LINK_LAG_SECONDS``,
  ``BACKLOG_RECORDS``, ``LINK_UP`` and ``STATUS_CHANGES`` (a counter).
"""

from __future__ import annotations

import math

# --- the statuses ---
OK = "ok"
LINK_DELAYED = "link_delayed"    # the region's telemetry is late: its link is cut or slow, or the mirror behind
GATEWAYS_DOWN = "gateways_down"  # the link works, the regional cluster answers, and its gateways write no beacon
NO_TRAFFIC = "no_traffic"        # beacons arrive on time but the gateways received no request
STATUSES: tuple[str, ...] = (OK, LINK_DELAYED, GATEWAYS_DOWN, NO_TRAFFIC)

# Why a region is link_delayed (the record's ``cause``)
CAUSE_LINK = "link"      # the regional cluster cannot be reached through the link (cut, reset, broker down)
CAUSE_MIRROR = "mirror"  # reachable, but the mirrored beacons lag the region's (MM2 draining, slow or down)

# The gateways' beacon period (collectors/gateway.yaml's periodic reader interval, in ms there)
BEACON_INTERVAL_S = 2.0
# The judgement's bounds (stack/region_status.py, Thresholds; the alert texts quote them)
LINK_TIMEOUT_S = 6.0      # no probe through the link answered for this long: link_delayed (cause link)
LAG_BOUND_S = 8.0         # the mirrored beacons this far behind the region's: link_delayed (cause mirror)
BEACONS_TIMEOUT_S = 10.0  # the link answers and the regional beacon topic stood still this long: gateways_down
IDLE_S = 30.0             # beacons on time and no span accepted over this much of them: no_traffic

# --- Prometheus (the names the service exposes; dashboards and alert rules derive theirs from here) ---
REGION_STATUS_JOB = "region_status"
LABEL_REGION = "region"
LABEL_STATUS = "status"
STATUS = "infersight_region_status"                      # gauge, 1 for the region's current status
LINK_LAG_SECONDS = "infersight_region_link_lag_seconds"  # gauge: how far the mirrored beacons are behind
BACKLOG_RECORDS = "infersight_region_backlog_records"    # gauge: records in the region not yet mirrored
LINK_UP = "infersight_region_link_up"                    # gauge: 1 when the last probe through the link answered
STATUS_CHANGES = "infersight_region_status_changes_total"  # counter of transitions

# --- the record on infersight.region_status (JSON; key: the region) ---
RECORD_FIELDS: tuple[str, ...] = (
    "region",           # the region (also the record's key)
    "status",           # one of STATUSES
    "since_ms",         # when the region entered this status (the service's clock, epoch ms)
    "at_ms",            # when this record was judged
    "cause",            # link_delayed: CAUSE_LINK or CAUSE_MIRROR; otherwise ""
    "link_up",          # the last probe of the regional cluster through the link answered in time
    "link_lag_s",       # how far behind the region's newest beacon the newest mirrored one is (seconds)
    "backlog_records",  # records in the region's mirrored topics that MM2 has not copied yet (null: unknown)
    "backlog_estimated",  # true while the link is down: the last measured backlog plus the rate since
    "gateways",         # gateways whose beacons were mirrored in the last minute
    "spans_per_s",      # spans the region's gateways accepted per second, from the mirrored beacons
    "queue_size",       # the gateways' exporter queues (sum), from the newest mirrored beacons
    "reason",           # one line for people: why this status
)


def record_problem(value: object) -> str | None:
    """Why a decoded ``infersight.region_status`` record cannot be used (a short reason for the dead-letter
    topic), or None. Only the fields a reader acts on are checked; the others are informative."""
    if not isinstance(value, dict):
        return "not_an_object"
    for name in ("region", "status", "at_ms"):
        if name not in value:
            return f"missing_{name}"
    if not isinstance(value["region"], str) or not value["region"]:
        return "bad_region"
    if value["status"] not in STATUSES:
        return "unknown_status"
    at_ms = value["at_ms"]
    if isinstance(at_ms, bool) or not isinstance(at_ms, int) or at_ms < 0:
        return "bad_at_ms"
    for name in ("link_lag_s", "backlog_records"):
        v = value.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            return f"bad_{name}"
    return None

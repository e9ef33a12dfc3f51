"""The canary verdicts' contract: the event on ``infersight.rollout.verdicts`` (one compacted key per rollout),
the Prometheus metrics the canary job writes, and the verdict codes they carry."""

from __future__ import annotations

from infersight.schemas.prometheus import prometheus_name

VERDICTS = ("pass", "marginal", "inconclusive", "fail")
VERDICT_CODE = {v: i for i, v in enumerate(VERDICTS)}  # the gauge's value: higher is worse
ALL_REGIONS_LABEL = "all"  # the region of a model's overall verdict (every region's requests)

LABEL_CANARY_VERSION = "canary_version"
LABEL_METRIC = "metric"
VERDICT = "infersight.canary.verdict"   # gauge: VERDICT_CODE of the current verdict
FINAL = "infersight.canary.final"       # gauge: 1 once the verdict is final
SHIFT = "infersight.canary.shift"       # gauge per judged metric: canary - stable (relative for latencies)
VERDICT_UNIT, FINAL_UNIT, SHIFT_UNIT = "{verdict}", "{bool}", "{shift}"
PROM_VERDICT = prometheus_name(VERDICT, VERDICT_UNIT, "gauge")
PROM_FINAL = prometheus_name(FINAL, FINAL_UNIT, "gauge")
PROM_SHIFT = prometheus_name(SHIFT, SHIFT_UNIT, "gauge")

# fields of a verdict event (JSON object), besides per-metric results under "metrics"
EVENT_FIELDS = ("rollout", "model", "canary_version", "region", "stable_versions", "verdict", "final", "reasons",
                "look", "elapsed_s", "bake_s", "start_ns", "at_ns", "metrics")


def rollout_id(model: str, canary_version: str, region: str) -> str:
    """The compacted topic's key and the verdict service's path: ``model/canary_version/region``."""
    return f"{model}/{canary_version}/{region or ALL_REGIONS_LABEL}"

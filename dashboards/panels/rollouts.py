"""The canary job's verdicts (docs/canary.md): per rollout (model, canary version, region; region "all" for the
model's overall bake) the current verdict, whether it is final, and each judged metric's shift, canary vs stable."""

from __future__ import annotations

from infersight.dashboards.common import query, stat_panel, thresholds, timeseries_panel
from infersight.schemas import canary as C

SEL = '{model=~"$model", region=~"$region|all"}'
BY = f"model, {C.LABEL_CANARY_VERSION}, region"
CODES = ", ".join(f"{code} {name}" for name, code in C.VERDICT_CODE.items())
VERDICT_STEPS = ((None, "green"), (C.VERDICT_CODE["marginal"], "yellow"),
                 (C.VERDICT_CODE["inconclusive"], "blue"), (C.VERDICT_CODE["fail"], "red"))


def verdict_now():
    return stat_panel(
        "Canary verdict now", f"Per rollout (model, canary version, region; \"all\": the model's overall bake), the "
        f"current verdict: {CODES}. InfersightCanaryFail fires on fail.", "none", thresholds(*VERDICT_STEPS),
        query(f"max by ({BY}) (last_over_time({C.PROM_VERDICT}{SEL}[5m]))",
              "{{model}} {{canary_version}} {{region}}", instant=True))


def verdict_over_time():
    return timeseries_panel(
        "Canary verdict over the bake", f"The verdict at each look ({CODES}); it is final at the bake's end or at an "
        "early fail.", "none", thresholds(*VERDICT_STEPS),
        query(f"max by ({BY}) ({C.PROM_VERDICT}{SEL})", "{{model}} {{canary_version}} {{region}}"))


def final_verdicts():
    return stat_panel(
        "Final verdicts", "Rollouts whose verdict is final (bake over, or failed early).", "short",
        thresholds((None, "green")),
        query(f"sum(max by ({BY}) (last_over_time({C.PROM_FINAL}{SEL}[1h])))", "final", instant=True))


def metric_shift():
    return timeseries_panel(
        "Canary vs stable, per metric", "Hodges-Lehmann shift of the canary against stable in the same region and "
        "time (relative for latencies: 0.1 = 10 % slower; absolute for ratios and scores).", "none",
        thresholds((None, "green")),
        query(f"max by (model, region, {C.LABEL_METRIC}) ({C.PROM_SHIFT}{SEL})",
              "{{model}} {{region}} {{metric}}"))

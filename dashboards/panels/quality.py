"""The quality job's view (docs/quality.md): per deployment (region, model, version, track) the composite score, each
evaluator's weighted mean with its 95 % interval, pass and flag ratios, the judged samples behind them, the drift
distances against their alarm thresholds and the open drift alarms, and canary against stable."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from infersight.dashboards.common import (
    COMPOSITE_FLOOR,
    GUARDRAIL_FLAG_BOUND,
    PASS_RATIO_FLOOR,
    query,
    sel,
    stat_panel,
    thresholds,
    timeseries_panel,
)
from infersight.schemas import canary as C
from infersight.schemas import pipeline as P
from infersight.schemas import quality as Q

SCORE = P.prom(P.QUALITY_SCORE)
CI_LOW = P.prom(P.QUALITY_SCORE_CI_LOW)
CI_HIGH = P.prom(P.QUALITY_SCORE_CI_HIGH)
PASS = P.prom(P.QUALITY_PASS_RATIO)
FLAG = P.prom(P.QUALITY_FLAG_RATIO)
SAMPLES = P.prom(P.QUALITY_SAMPLES)
COMPOSITE = P.prom(P.QUALITY_COMPOSITE)
DISTANCE = P.prom(P.DRIFT_DISTANCE)
ALARM = P.prom(P.DRIFT_ALARM)

SERIES = f"{P.LABEL_REGION}, {P.LABEL_MODEL}, {P.LABEL_MODEL_VERSION}, {P.LABEL_TRACK}"
SERIES_LEGEND = "{{region}} {{model}} {{model_version}} {{track}}"
SCORED = f'{P.LABEL_EVALUATOR}=~"{"|".join(Q.SCORED_EVALUATORS)}"'
GUARDRAIL = f'{P.LABEL_EVALUATOR}=~"{"|".join(Q.GUARDRAILS)}"'
# The sampled signals (judge scores, guardrail flags) alarm on the Wasserstein distance (a mean or rate shift), the
# traffic signals (lengths, TTFT, finish reasons, error types) on PSI: one panel each, with their thresholds.
SAMPLED = [s for s in Q.DRIFT_SIGNALS if s.sampled]
TRAFFIC = [s for s in Q.DRIFT_SIGNALS if not s.sampled]


def _signals(signals) -> str:
    return f'{P.LABEL_SIGNAL}=~"{"|".join(s.name for s in signals)}"'


def _score_steps():
    return thresholds((None, "red"), (COMPOSITE_FLOOR, "green"))


def composite_by_model_version():
    return timeseries_panel(
        "Composite quality by model and version", "The composite score (0..1, 1 best: relevance 0.4, faithfulness "
        "0.3, harmfulness 0.1, each guardrail 0.05, absent ones renormalised away) per model and version, the worst "
        f"of its regions and tracks in each window. The line: {COMPOSITE_FLOOR:g} (the simulated healthy fleet "
        "scores ~0.84: relevance 0.8, 2 % refusals, 0.5 % PII).", "percentunit", _score_steps(),
        query(f"min by ({P.LABEL_MODEL}, {P.LABEL_MODEL_VERSION}) ({COMPOSITE}{sel()})",
              "{{model}} {{model_version}}"))


def composite_now():
    return stat_panel(
        "Composite quality now", f"Per model, the worst series' composite score in its latest window (red under "
        f"{COMPOSITE_FLOOR:g}).", "percentunit", _score_steps(),
        query(f"min by ({P.LABEL_MODEL}) (last_over_time({COMPOSITE}{sel()}[5m]))", "{{model}}", instant=True))


def evaluator_scores():
    """The mean as a solid line, the interval's bounds dashed (queries B and C)."""
    dashed = [dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [4, 4]}),
              dm.DynamicConfigValue(id_val="custom.lineWidth", value=1)]
    panel = timeseries_panel(
        "Evaluator scores with 95 % intervals", "Each scored evaluator's weighted mean (Hájek, weights 1 / sample "
        "rate) per series and window, its 95 % Student-t interval dashed. Narrow the variables to compare a few "
        f"series. The line: the pass threshold {Q.PASS_THRESHOLD:g} (lower is better for harmfulness).",
        "percentunit", thresholds((None, "red"), (Q.PASS_THRESHOLD, "green")),
        query(f"max by ({SERIES}, {P.LABEL_EVALUATOR}) ({SCORE}{sel(SCORED)})", f"{SERIES_LEGEND} {{{{evaluator}}}}"),
        query(f"max by ({SERIES}, {P.LABEL_EVALUATOR}) ({CI_LOW}{sel(SCORED)})",
              f"{SERIES_LEGEND} {{{{evaluator}}}} low", ref="B"),
        query(f"max by ({SERIES}, {P.LABEL_EVALUATOR}) ({CI_HIGH}{sel(SCORED)})",
              f"{SERIES_LEGEND} {{{{evaluator}}}} high", ref="C"))
    return panel.override_by_query("B", dashed).override_by_query("C", dashed)


def pass_ratio():
    return timeseries_panel(
        "Pass ratio", f"Weighted share of judged answers passing each scored evaluator (score >= {Q.PASS_THRESHOLD:g}; "
        f"<= for harmfulness) per model and region, the worst version and track. The line: {PASS_RATIO_FLOOR:g}.",
        "percentunit", thresholds((None, "red"), (PASS_RATIO_FLOOR, "green")),
        query(f"min by ({P.LABEL_REGION}, {P.LABEL_MODEL}, {P.LABEL_EVALUATOR}) ({PASS}{sel(SCORED)})",
              "{{region}} {{model}} {{evaluator}}"))


def flag_ratio():
    return timeseries_panel(
        "Guardrail flag rates", "Weighted share of answers each guardrail flagged (PII, refusal, empty or truncated, "
        "language mismatch) per model and region, the worst version and track. The line: "
        f"{GUARDRAIL_FLAG_BOUND:g}, where InfersightGuardrailSurge fires (held 5 minutes over 10 minutes' "
        "windows).", "percentunit", thresholds((None, "green"), (GUARDRAIL_FLAG_BOUND, "red")),
        query(f"max by ({P.LABEL_REGION}, {P.LABEL_MODEL}, {P.LABEL_EVALUATOR}) ({FLAG}{sel(GUARDRAIL)})",
              "{{region}} {{model}} {{evaluator}}"))


def judged_samples():
    return timeseries_panel(
        "Judged samples per window", "Judged answers behind each window's estimates per region and model (raw "
        "count, the evaluator with the most per series, summed over versions and tracks). Few samples: wide "
        "intervals; drift may alarm only once its current set holds 600 judged results.", "short",
        thresholds((None, "orange"), (30, "green")),
        query(f"sum by ({P.LABEL_REGION}, {P.LABEL_MODEL}) (max by ({SERIES}) ({SAMPLES}{sel()}))",
              "{{region}} {{model}}"))


def _drift_panel(title: str, signals, distance: str):
    bounds = sorted({s.threshold for s in signals})
    by_distance = f'{P.LABEL_DISTANCE}="{distance}"'
    steps = [(None, "green"), *((b, "red" if b == bounds[-1] else "orange") for b in bounds)]
    return timeseries_panel(
        title, f"The {distance} distance of each signal's current window set from its baseline (docs/quality.md), "
        f"the largest over versions and tracks. Thresholds: "
        + ", ".join(f"{s.name} {s.threshold:g}" for s in signals)
        + "; a signal alarms after two evaluations over it with enough samples.", "none", thresholds(*steps),
        query(f"max by ({P.LABEL_REGION}, {P.LABEL_MODEL}, {P.LABEL_SIGNAL}) "
              f"({DISTANCE}{sel(_signals(signals), by_distance)})",
              "{{region}} {{model}} {{signal}}"))


def drift_scores():
    return _drift_panel("Drift of judge scores and guardrail flags (Wasserstein)", SAMPLED, "wasserstein")


def drift_traffic():
    return _drift_panel("Drift of lengths, TTFT, finish reasons and errors (PSI)", TRAFFIC, "psi")


def drift_alarms_now():
    return stat_panel(
        "Open drift alarms", "Drift signals alarming now per region and model (infersight_quality_drift_alarm in the "
        "latest window); InfersightQualityDrift fires on one held for 5 minutes.", "short",
        thresholds((None, "green"), (1, "red")),
        query(f"sum by ({P.LABEL_REGION}, {P.LABEL_MODEL}) (max by ({P.LABEL_REGION}, {P.LABEL_MODEL}, "
              f"{P.LABEL_SIGNAL}) (last_over_time({ALARM}{sel()}[5m])))", "{{region}} {{model}}", instant=True))


def drift_alarms_over_time():
    return timeseries_panel(
        "Drift alarms by signal", "1 while a signal's drift alarm is open (any version or track of the region and "
        "model).", "short", thresholds((None, "green"), (1, "red")),
        query(f"max by ({P.LABEL_REGION}, {P.LABEL_MODEL}, {P.LABEL_SIGNAL}) ({ALARM}{sel()})",
              "{{region}} {{model}} {{signal}}"))


def canary_vs_stable():
    return timeseries_panel(
        "Canary vs stable quality", "The composite score of each model's canary and stable tracks side by side (the "
        "mean over regions and versions), and, where the canary job judges quality (requests carrying a quality "
        "score), its Hodges-Lehmann shift of the canary's quality score against stable (\"shift\", score points; "
        f"its tolerance 0.02). The line: {COMPOSITE_FLOOR:g}.", "percentunit", _score_steps(),
        query(f"avg by ({P.LABEL_MODEL}, {P.LABEL_TRACK}) ({COMPOSITE}{sel()})", "{{model}} {{track}}"),
        query(f'max by (model, region) ({C.PROM_SHIFT}{{model=~"$model", region=~"$region|all", '
              f'{C.LABEL_METRIC}="quality_score"}})', "shift {{model}} {{region}}", ref="B"))

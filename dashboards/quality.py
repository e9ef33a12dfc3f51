"""ML quality: the quality job's weighted estimates, drift and canary against stable (docs/quality.md)."""

from __future__ import annotations

from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import quality
from infersight.schemas import pipeline as P

UID = "infersight-quality"


def build():
    dash = dashboard(UID, "infersight / ML quality", "Answer quality from the sampled judges and guardrails "
                     "(estimates weighted by 1 / sample rate), drift of scores and traffic against a baseline, and "
                     "canary against stable.", ["quality"])
    for v in variables(metric=P.prom(P.QUALITY_COMPOSITE)):
        dash = dash.with_variable(v)
    return compose(dash, [
        ("Quality", [quality.composite_now(), quality.drift_alarms_now(), quality.composite_by_model_version(),
                     quality.evaluator_scores(), quality.pass_ratio(), quality.flag_ratio(),
                     quality.judged_samples()]),
        ("Drift", [quality.drift_scores(), quality.drift_traffic(), quality.drift_alarms_over_time()]),
        ("Canary vs stable", [quality.canary_vs_stable()]),
    ])

"""Rollouts: the canary job's verdicts and per-metric shifts (docs/canary.md)."""

from __future__ import annotations

from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import rollouts

UID = "infersight-rollouts"


def build():
    dash = dashboard(UID, "infersight / Rollouts", "Canary verdicts per model, canary version and region during "
                     "their bake, and how the canary differs from stable on each judged metric.", ["rollouts"])
    for v in variables(names=("region", "model")):
        dash = dash.with_variable(v)
    return compose(dash, [
        ("Verdicts", [rollouts.verdict_now(), rollouts.final_verdicts(), rollouts.verdict_over_time()]),
        ("Canary vs stable", [rollouts.metric_shift()]),
    ])

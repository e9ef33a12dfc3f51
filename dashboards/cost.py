"""Cost and efficiency: what a million tokens costs per region and model, and how much GPU time is idle."""

from __future__ import annotations

from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import cost

UID = "infersight-cost"


def build():
    dash = dashboard(UID, "infersight / Cost and efficiency", "USD per 1M output tokens, GPU-hours and USD "
                     "per day, idle cost, tokens per GPU-second and utilisation, from the pricing file.", ["cost"])
    for v in variables():
        dash = dash.with_variable(v)
    return compose(dash, [
        ("Unit cost", [cost.usd_per_1m_output_tokens(), cost.output_tokens_per_gpu_second()]),
        ("Spend", [cost.usd_per_day(), cost.gpu_hours_per_day(), cost.idle_cost(), cost.utilization()]),
        ("Idle", [cost.idle_share()]),
    ])

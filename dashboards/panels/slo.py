"""Error budget and burn rate, from the recording rules of ``infersight.dashboards.rules``."""

from __future__ import annotations

from infersight.dashboards import rules as R
from infersight.dashboards import slo as S
from infersight.dashboards.common import query, stat_panel, thresholds, timeseries_panel

SEL = '{region=~"$region", model=~"$model"}'


def budget_remaining(config: S.SLOConfig, slo: str, title: str):
    period = f"{config.default.period_days}d"
    return stat_panel(
        f"{title} error budget remaining ({period})",
        f"1 - the burn rate over {period}: the share of the {period} budget left if the rate so far holds "
        "(each model's own objective, slo.yaml).", "percentunit",
        thresholds((None, "red"), (0, "orange"), (0.25, "green")),
        query(f"1 - max by (region, model) ({R.burn(slo, period)}{SEL})", "{{region}} {{model}}", instant=True))


def burn_rate(slo: str, title: str):
    fast, slow = R.BURN_ALERTS[0][3], R.BURN_ALERTS[1][3]
    return timeseries_panel(
        f"{title} burn rate (1h, 6h)", f"Bad-request ratio / the objective's allowance; the alerts page at "
        f"{fast:g}x over 1h (and 5m) and {slow:g}x over 6h (and 30m). 1x spends the budget in exactly its period.",
        "x", thresholds((None, "green"), (1, "orange"), (slow, "red"), (fast, "dark-red")),
        query(f"max by (region, model) ({R.burn(slo, '1h')}{SEL})", "1h {{region}} {{model}}"),
        query(f"max by (region, model) ({R.burn(slo, '6h')}{SEL})", "6h {{region}} {{model}}", ref="B"))

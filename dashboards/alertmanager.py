"""alertmanager.yml: route by severity and region, one notification per region's incident, to a webhook.

Critical alerts page (``/page``), warnings open tickets (``/ticket``). Grouping by region puts the alerts
one regional incident raises (burn rates, active anomalies, the detect job's incident) in one notification;
a page in a region holds back that region's tickets (inhibit rule) while it fires.
"""

from __future__ import annotations

from typing import Any

from infersight.dashboards.rules import CRITICAL, WARNING

# Where the stack's (or compose's) webhook receiver listens; the stack rewrites it for its own port plan.
WEBHOOK = "http://127.0.0.1:5001"


def config(webhook: str = WEBHOOK) -> dict[str, Any]:
    return {
        "route": {
            "receiver": "ticket",
            "group_by": ["alertname", "region"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "12h",
            "routes": [
                {"matchers": [f'severity="{CRITICAL}"'], "receiver": "page", "group_by": ["region"],
                 "group_wait": "10s", "group_interval": "1m", "repeat_interval": "1h"},
                {"matchers": [f'severity="{WARNING}"'], "receiver": "ticket"},
            ],
        },
        "inhibit_rules": [
            {"source_matchers": [f'severity="{CRITICAL}"'], "target_matchers": [f'severity="{WARNING}"'],
             "equal": ["region"]},
        ],
        "receivers": [
            {"name": "page", "webhook_configs": [{"url": f"{webhook}/page", "send_resolved": True}]},
            {"name": "ticket", "webhook_configs": [{"url": f"{webhook}/ticket", "send_resolved": True}]},
        ],
    }

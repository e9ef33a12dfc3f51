"""Prometheus rules as code: SLO recording rules, burn-rate alerts, detection and pipeline-health alerts.

Every alert carries ``severity`` (critical pages, warning tickets) and ``region`` labels (Alertmanager routes
on both) and ``summary`` + ``runbook_url`` annotations; the URL's anchor is the alert's name lowercased, a
``## <AlertName>`` heading of docs/runbook.md (tests/unit/test_alert_rules.py checks each exists).
"""

from __future__ import annotations

from typing import Any

from infersight.dashboards import slo as S
from infersight.dashboards.common import (
    ERRORS,
    FLINK_CHECKPOINTS_FAILED,
    FLINK_JOB_RUNNING,
    FLINK_PENDING_RECORDS,
    FLINK_RESTARTS,
    GUARDRAIL_FLAG_BOUND,
    KAFKA_JOB,
    KAFKA_MESSAGES_IN,
    OTELCOL_JOB,
    OTELCOL_QUEUE_CAPACITY,
    OTELCOL_QUEUE_SIZE,
    OTELCOL_REFUSED_SPANS,
    REQUESTS,
    TTFT,
)
from infersight.schemas import canary as C
from infersight.schemas import pipeline as P
from infersight.schemas import quality as Q
from infersight.schemas import region_status as RS
from infersight.schemas.topics import DLQ

RUNBOOK = "docs/runbook.md"
CRITICAL, WARNING = "critical", "warning"

# The SRE workbook's multiwindow, multi-burn-rate alerts ("Alerting on SLOs", table 5-8, recommended
# parameters for a 30-day SLO): (name, long window, short window, burn rate, severity). Burn rate 14.4 over
# 1 h spends 2 % of the budget, 6 over 6 h spends 5 %, 1 over 3 d spends 10 %; the short window makes the
# alert stop soon after the burn stops.
BURN_ALERTS: tuple[tuple[str, str, str, float, str], ...] = (
    ("Fast", "1h", "5m", 14.4, CRITICAL),
    ("Slow", "6h", "30m", 6.0, CRITICAL),
    ("Ticket", "3d", "6h", 1.0, WARNING),
)
SHORT_WINDOWS = ("5m", "30m", "1h", "6h")
LONG_WINDOWS = ("3d",)
WINDOWS = (*SHORT_WINDOWS, *LONG_WINDOWS)

# Per-region, per-deployment series only (the metrics job also writes region="global" roll-ups).
REGIONAL = f'{P.LABEL_REGION}!="{P.GLOBAL_REGION}"'
BY = f"{P.LABEL_REGION}, {P.LABEL_MODEL}"
WINDOW_REQUESTS = P.prom(P.WINDOW_REQUESTS)
LATE = P.prom(P.LATE_RECORDS)
OPEN_INCIDENTS = P.prom(P.OPEN_INCIDENTS)
ANOMALY_SCORE = P.prom(P.ANOMALY_SCORE)

FRESHNESS_BOUND_S = 45  # measured freshness p99 is ~16 s at 3,000 requests/s (docs/pipeline.md)
NO_DATA_FOR = "3m"
LATE_RATIO_BOUND = 0.01
QUEUE_FILL_BOUND = 0.5
# Kafka messages a job's sources have not read (one message is one export batch, ~10-100 requests): a backlog
# this size held 5 minutes means the job falls behind, not a burst it is catching up on.
CONSUMER_LAG_BOUND = 5000


def runbook_url(alert: str) -> str:
    return f"{RUNBOOK}#{alert.lower()}"


def alert(name: str, expr: str, severity: str, summary: str, description: str, for_: str = "",
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {"summary": summary, "description": description, "runbook_url": runbook_url(name)}
    return rule


def record(name: str, expr: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


# -- SLOs -----------------------------------------------------------------------------------------------
def ttft_bad_ratio(w: str) -> str:
    return f"infersight:slo_ttft_bad:ratio_rate{w}"


def errors_ratio(w: str) -> str:
    return f"infersight:slo_errors:ratio_rate{w}"


def burn(slo: str, w: str) -> str:
    return f"infersight:slo_{slo}:burnrate{w}"


def slo_recording_rules(config: S.SLOConfig, windows: tuple[str, ...] = WINDOWS) -> list[dict[str, Any]]:
    """Bad-request ratios per (region, model) over each window, then burn rates = ratio / (1 - objective)
    with each model's objective. Good TTFT = counted in the bucket le=<threshold> (a bound: slo.py checks)."""
    rules = []
    for w in windows:
        for matcher, o in config.groups():
            good = f'{TTFT}_bucket{{{REGIONAL}, {matcher}, le="{S.le(o.ttft_threshold_s)}"}}'
            total = f"{TTFT}_count{{{REGIONAL}, {matcher}}}"
            rules.append(record(ttft_bad_ratio(w), f"1 - sum by ({BY}) (rate({good}[{w}]))\n"
                                                   f"  / sum by ({BY}) (rate({total}[{w}]))"))
        # A series without errors has no error counter: "or 0 x requests" makes its ratio 0, not absent.
        req = f"sum by ({BY}) (rate({REQUESTS}{{{REGIONAL}}}[{w}]))"
        rules.append(record(errors_ratio(w), f"(sum by ({BY}) (rate({ERRORS}{{{REGIONAL}}}[{w}])) or 0 * {req})\n"
                                             f"  / {req}"))
        for matcher, o in config.groups():
            rules.append(record(burn("ttft", w), f"{ttft_bad_ratio(w)}{{{matcher}}} / {1 - o.ttft_objective:.6g}"))
            rules.append(record(burn("errors", w),
                                f"{errors_ratio(w)}{{{matcher}}} / {1 - o.availability_objective:.6g}"))
    return rules


def slo_alerts() -> list[dict[str, Any]]:
    out = []
    for slo, title, what in (("ttft", "TTFT", "requests slower than the TTFT threshold"),
                             ("errors", "Availability", "failed requests")):
        for suffix, long_w, short_w, rate, severity in BURN_ALERTS:
            name = f"Infersight{title}BudgetBurn{suffix}"
            out.append(alert(
                name, f"{burn(slo, long_w)} > {rate:g}\nand\n{burn(slo, short_w)} > {rate:g}", severity,
                f"{{{{ $labels.region }}}}/{{{{ $labels.model }}}}: {what} burn the {title} error budget "
                f"{{{{ $value | printf \"%.1f\" }}}}x too fast",
                f"Burn rate over {long_w} and {short_w} above {rate:g} (SRE workbook: at this rate the "
                f"{long_w} window spends {rate * _hours(long_w) / (30 * 24):.0%} of a 30-day budget).",
            ))
    return out


def _hours(w: str) -> float:
    n, unit = float(w[:-1]), w[-1]
    return n * {"m": 1 / 60, "h": 1, "d": 24}[unit]


# -- detection ------------------------------------------------------------------------------------------
def detection_alerts() -> list[dict[str, Any]]:
    wide = 'scope_kind=~"region|multi_region|global"'
    return [
        alert("InfersightIncidentOpenWide", f"max by (scope_kind, kind) ({OPEN_INCIDENTS}{{{wide}}}) > 0",
              CRITICAL, "{{ $value }} {{ $labels.kind }} incident(s) open at {{ $labels.scope_kind }} scope",
              "The detect job correlated anomalies into an incident spanning a region or more; its regions, "
              "cause and summary are on the infersight.anomalies topic.",
              labels={"region": "all"}),
        alert("InfersightIncidentOpen",
              f'max by (scope_kind, kind) ({OPEN_INCIDENTS}{{scope_kind!~"region|multi_region|global"}}) > 0',
              WARNING, "{{ $value }} {{ $labels.kind }} incident(s) open at {{ $labels.scope_kind }} scope",
              "The detect job has an incident open on one series or one model in one region.",
              labels={"region": "all"}),
        # The score gauge is written only while an anomaly lasts: last 1 m, so the alert ends with it.
        alert("InfersightAnomalyActive",
              f"max by (region, model, signal) (last_over_time({ANOMALY_SCORE}[1m])) > 0", WARNING,
              "{{ $labels.region }}/{{ $labels.model }}: anomaly on {{ $labels.signal }} "
              "(score {{ $value | printf \"%.1f\" }})",
              "A detector of the detect job is in an anomaly episode on this series.", for_="1m"),
    ]


# -- region status (multi-region: schemas/region_status.py) --------------------------------------------
def region_in(status: str) -> str:
    """The regions whose current status is ``status`` (value 1, by region)."""
    return f'max by ({RS.LABEL_REGION}) ({RS.STATUS}{{{RS.LABEL_STATUS}="{status}"}} == 1)'


# A region whose telemetry is late (its link cut, the mirror behind) is delayed, not down: the alerts that read
# "no data" from a region hold off while it is, or every network blip between regions would page.
UNLESS_DELAYED = f"\nunless on ({RS.LABEL_REGION})\n{region_in(RS.LINK_DELAYED)}"
REGION_STATUS_FOR = "30s"


def region_status_alerts() -> list[dict[str, Any]]:
    """Delayed and down from the region status service: one status per region at a time (one-hot), so the two
    never fire together; down also names delayed as its exception, should two statuses ever be reported."""
    return [
        alert("InfersightRegionTelemetryDelayed",
              f"max by ({RS.LABEL_REGION}) ({RS.LINK_LAG_SECONDS})\nand on ({RS.LABEL_REGION})\n"
              f"{region_in(RS.LINK_DELAYED)}", WARNING,
              "Telemetry from {{ $labels.region }} delayed {{ $value | humanizeDuration }} (link)",
              "The region's telemetry reaches the global cluster late: its link is cut or slow, or MirrorMaker 2 "
              "is behind. Its data is kept in the regional Kafka and is counted in its own windows when it "
              "arrives; the region is not known to be down.", for_=REGION_STATUS_FOR),
        alert("InfersightRegionDown",
              f"{region_in(RS.GATEWAYS_DOWN)}{UNLESS_DELAYED}", CRITICAL,
              "Region {{ $labels.region }} down: its gateways write no beacon",
              "The link to the region works and its Kafka answers, but none of its gateways wrote a beacon for "
              f"{RS.BEACONS_TIMEOUT_S:g} s: the gateways are down or cannot reach their Kafka, and the region's "
              "telemetry is being lost at the pods (their SDKs retry, then drop).", for_=REGION_STATUS_FOR),
    ]


# -- the pipeline itself ----------------------------------------------------------------------------------
def pipeline_alerts() -> list[dict[str, Any]]:
    win = f"{WINDOW_REQUESTS}{{{REGIONAL}}}"
    return [
        alert("InfersightPipelineStale",
              f"time() - max by (region) (timestamp({win})) > {FRESHNESS_BOUND_S}{UNLESS_DELAYED}", WARNING,
              "{{ $labels.region }}: newest window is {{ $value | humanizeDuration }} old",
              f"The metrics job's newest window for the region ended more than {FRESHNESS_BOUND_S} s ago "
              "(10 s windows; freshness p99 is ~16 s when healthy).", for_="1m"),
        alert("InfersightRegionNoData",
              f"count by (region) (max_over_time({win}[1h]))\nunless\n"
              f"count by (region) (last_over_time({win}[2m])){UNLESS_DELAYED}", CRITICAL,
              "{{ $labels.region }}: no window from the pipeline for 2 minutes",
              "The region reported in the last hour but no window reached Prometheus in the last 2 minutes: "
              "its pods, gateway, or the jobs stopped.", for_="1m"),
        alert("InfersightPipelineNoData", f"absent(last_over_time({WINDOW_REQUESTS}[2m]))", CRITICAL,
              "No window from the metrics job in Prometheus for 2 minutes",
              "Nothing from any region: the metrics job, the sink collector, Kafka or Prometheus' "
              "remote-write receiver is down.", for_=NO_DATA_FOR, labels={"region": "all"}),
        alert("InfersightLateRecords",
              f"sum by (region) (rate({LATE}{{{REGIONAL}}}[10m]))\n"
              f"  / sum by (region) (rate({REQUESTS}{{{REGIONAL}}}[10m])) > {LATE_RATIO_BOUND:g}", WARNING,
              "{{ $labels.region }}: {{ $value | humanizePercentage }} of requests miss their window",
              "Records arriving after their window closed go to infersight.late and are missing from the "
              "window's numbers.", for_="10m"),
    ]


def collector_alerts() -> list[dict[str, Any]]:
    job = f'job="{OTELCOL_JOB}"'
    return [
        alert("InfersightCollectorDown", f"up{{{job}}} == 0", CRITICAL,
              "{{ $labels.region }}: the {{ $labels.collector }} collector does not answer its telemetry scrape",
              "Prometheus cannot scrape the collector's own telemetry: it is down or hung; a gateway that is "
              "down refuses its region's telemetry.", for_="1m"),
        alert("InfersightCollectorRefusing",
              f"sum by (region, collector) (rate({OTELCOL_REFUSED_SPANS}{{{job}}}[5m])) > 0", CRITICAL,
              "{{ $labels.region }}: the {{ $labels.collector }} collector refuses "
              "{{ $value | humanize }} spans/s",
              "The collector's receiver answers pods with an error (memory limiter or a full queue): their SDKs "
              "retry, then drop.", for_="5m"),
        alert("InfersightCollectorQueueFilling",
              f"max by (region, collector, exporter) ({OTELCOL_QUEUE_SIZE}{{{job}}}\n"
              f"  / {OTELCOL_QUEUE_CAPACITY}{{{job}}}) > {QUEUE_FILL_BOUND:g}", WARNING,
              "{{ $labels.region }}: {{ $labels.exporter }} queue of the {{ $labels.collector }} collector "
              "{{ $value | humanizePercentage }} full",
              "The exporter cannot keep up or cannot reach Kafka (gateways) or Prometheus (sink); when full, "
              "the collector refuses data.", for_="5m"),
    ]


def flink_alerts() -> list[dict[str, Any]]:
    job_region = {"region": "all"}
    return [
        alert("InfersightFlinkJobNotRunning",
              f"max by (job_name) (max_over_time({FLINK_JOB_RUNNING}[1h]))\nunless on (job_name)\n"
              f"max by (job_name) (last_over_time({FLINK_JOB_RUNNING}[1m]) == 1)", CRITICAL,
              "Flink job {{ $labels.job_name }} is not running",
              "The job reported in the last hour but is not RUNNING now (failing, restarting, cancelled or its "
              "cluster gone): its outputs stop.", for_="2m", labels=job_region),
        alert("InfersightFlinkJobRestarting",
              f"sum by (job_name) (increase({FLINK_RESTARTS}[15m])) > 2", WARNING,
              "Flink job {{ $labels.job_name }} restarted {{ $value | humanize }} times in 15 minutes",
              "Each restart fails the job over to its last checkpoint (nothing lost, output delayed); repeated "
              "ones mean a fault that does not go away.", labels=job_region),
        alert("InfersightCheckpointsFailing",
              f"sum by (job_name) (increase({FLINK_CHECKPOINTS_FAILED}[10m])) > 2", CRITICAL,
              "Flink job {{ $labels.job_name }}: {{ $value | humanize }} failed checkpoints in 10 minutes",
              "The job's exactly-once output reaches readers only at a completed checkpoint: while checkpoints "
              "fail, its numbers stop.", labels=job_region),
        alert("InfersightConsumerLag",
              f"sum by (job_name) ({FLINK_PENDING_RECORDS}) > {CONSUMER_LAG_BOUND}", WARNING,
              "Flink job {{ $labels.job_name }} is {{ $value | humanize }} Kafka messages behind",
              f"The job's sources have had more than {CONSUMER_LAG_BOUND} unread messages for 5 minutes: it "
              "cannot keep up (CPU, slots, a slow sink), and its numbers fall behind.", for_="5m",
              labels=job_region),
    ]


def kafka_alerts() -> list[dict[str, Any]]:
    job = f'job="{KAFKA_JOB}"'
    return [
        alert("InfersightKafkaDown", f"up{{{job}}} == 0", CRITICAL, "Kafka's broker does not answer its metrics scrape",
              "Prometheus cannot scrape the broker's JMX exporter: the broker is down or hung, and with it every "
              "job's input and output (the gateways queue on disk meanwhile).", for_="1m", labels={"region": "all"}),
        alert("InfersightDeadLetters",
              f'sum(increase({KAFKA_MESSAGES_IN}{{{job}, topic="{DLQ.name}"}}[10m])) > 0', WARNING,
              f"{{{{ $value | humanize }}}} records went to {DLQ.name} in 10 minutes",
              "A job could not read or validate telemetry (each dead letter names the reason, the job and the "
              "source offset); the rest keeps flowing.", labels={"region": "all"}),
    ]


def rollout_alerts() -> list[dict[str, Any]]:
    return [
        alert("InfersightCanaryFail", f"max by (model, {C.LABEL_CANARY_VERSION}, region) ({C.PROM_VERDICT}) "
              f"== {C.VERDICT_CODE['fail']}", CRITICAL,
              "{{ $labels.model }} {{ $labels.canary_version }} fails its canary in {{ $labels.region }}",
              "The canary job judged the canary worse than stable beyond its tolerance on a metric (a critical one, "
              "or at the bake's end): the rollout should stop and roll back (Argo Rollouts / Flagger do it when wired "
              "to the verdict service; see docs/canary.md)."),
    ]


# -- answer quality (the quality job, docs/quality.md) ----------------------------------------------------------
DRIFT_ALARM = P.prom(P.DRIFT_ALARM)
FLAG_RATIO = P.prom(P.QUALITY_FLAG_RATIO)
QUALITY_SAMPLES = P.prom(P.QUALITY_SAMPLES)
DRIFT_HELD = "5m"
# A flag ratio averaged over 10 minutes of windows, only where they hold this many judged results (fewer: a
# handful of flags is noise, 10 % of 30 answers is 3).
GUARDRAIL_MIN_SAMPLES = 100


def quality_alerts() -> list[dict[str, Any]]:
    quality_by = f"{P.LABEL_REGION}, {P.LABEL_MODEL}"
    guard = f'{REGIONAL}, {P.LABEL_EVALUATOR}=~"{"|".join(Q.GUARDRAILS)}"'
    return [
        # The job writes the alarm gauge once per window (stamped with its end): last 3 m spans a 60 s window's
        # lateness, so the alert ends soon after the alarm does.
        alert("InfersightQualityDrift",
              f"max by ({quality_by}, {P.LABEL_SIGNAL}) (last_over_time({DRIFT_ALARM}{{{REGIONAL}}}[3m])) == 1",
              WARNING, "{{ $labels.region }}/{{ $labels.model }}: {{ $labels.signal }} drifted from its baseline",
              "The quality job's drift alarm is open: the signal's distance from its baseline (previous day, the "
              "stable track or a pinned reference) is over its threshold with enough samples (docs/quality.md); the "
              "drift events on infersight.quality say which distance, by how much and since when.",
              for_=DRIFT_HELD),
        alert("InfersightGuardrailSurge",
              f"max by ({quality_by}, {P.LABEL_EVALUATOR}) (avg_over_time({FLAG_RATIO}{{{guard}}}[10m]))\n"
              f"  > {GUARDRAIL_FLAG_BOUND:g}\nand on ({quality_by}, {P.LABEL_EVALUATOR})\n"
              f"sum by ({quality_by}, {P.LABEL_EVALUATOR}) (sum_over_time({QUALITY_SAMPLES}{{{guard}}}[10m]))\n"
              f"  >= {GUARDRAIL_MIN_SAMPLES}", WARNING,
              "{{ $labels.region }}/{{ $labels.model }}: {{ $labels.evaluator }} flags "
              "{{ $value | humanizePercentage }} of answers",
              f"A guardrail flagged more than {GUARDRAIL_FLAG_BOUND:.0%} of the judged answers (the windows' "
              f"weighted flag rates averaged over 10 minutes, windows holding at least {GUARDRAIL_MIN_SAMPLES} judged "
              "results) for 5 minutes: leaked PII, a refusal wave, truncated or wrong-language answers.", for_="5m"),
    ]


def rule_files(config: S.SLOConfig) -> dict[str, dict[str, Any]]:
    """File name -> rule file (Prometheus' format), as the generator writes them."""
    return {
        "slo.rules.yml": {"groups": [
            {"name": "infersight-slo-recording", "rules": slo_recording_rules(config, SHORT_WINDOWS)},
            # the long windows read days of samples: once a minute is often enough for 3 d and 30 d
            {"name": "infersight-slo-recording-long", "interval": "1m",
             "rules": slo_recording_rules(config, (*LONG_WINDOWS, f"{config.default.period_days}d"))},
            {"name": "infersight-slo-alerts", "rules": slo_alerts()},
        ]},
        "detection.rules.yml": {"groups": [{"name": "infersight-detection", "rules": detection_alerts()}]},
        "rollouts.rules.yml": {"groups": [{"name": "infersight-rollouts", "rules": rollout_alerts()}]},
        "quality.rules.yml": {"groups": [{"name": "infersight-quality", "rules": quality_alerts()}]},
        "regions.rules.yml": {"groups": [{"name": "infersight-regions", "rules": region_status_alerts()}]},
        "pipeline.rules.yml": {"groups": [{"name": "infersight-pipeline", "rules": pipeline_alerts()},
                                          {"name": "infersight-collectors", "rules": collector_alerts()},
                                          {"name": "infersight-flink", "rules": flink_alerts()},
                                          {"name": "infersight-kafka", "rules": kafka_alerts()}]},
    }


def all_alerts(config: S.SLOConfig) -> list[dict[str, Any]]:
    return [r for f in rule_files(config).values() for g in f["groups"] for r in g["rules"] if "alert" in r]

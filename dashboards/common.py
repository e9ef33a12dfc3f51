"""What every dashboard shares: the datasource, the variables, label selectors and panel defaults.

Metric names come from ``schemas.pipeline`` (``P.prom``), never typed here: a renamed metric changes the
dashboards on the next ``python -m infersight.dashboards.generate`` and the drift test points at it.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pq
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from infersight.schemas import pipeline as P

# The uid dashboards/provisioning/datasources/prometheus.yaml gives the Prometheus datasource.
DATASOURCE_UID = "infersight-prometheus"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)

REGION, MODEL, VERSION, TRACK = P.LABEL_REGION, P.LABEL_MODEL, P.LABEL_MODEL_VERSION, P.LABEL_TRACK
# Variable name -> the Prometheus label it filters.
VARIABLES = {"region": REGION, "model": MODEL, "version": VERSION, "track": TRACK}

REQUESTS = P.prom(P.REQUESTS)
ERRORS = P.prom(P.ERRORS)
TOKENS = P.prom(P.TOKENS)
TTFT = P.prom(P.DISTRIBUTIONS["ttft_s"][0])
ITL_P99 = P.prom(P.DISTRIBUTIONS["itl_p99_s"][0])

# The collectors' own telemetry, scraped by Prometheus as job "otelcol" (stack/config/prometheus/prometheus.yml,
# targets labelled collector=gateway|sink and region). Not our contract, so not in schemas: the names the
# collector (0.165) serves on its telemetry port, counters without _total.
OTELCOL_JOB = "otelcol"
OTELCOL_UP = "up"
OTELCOL_QUEUE_SIZE = "otelcol_exporter_queue_size"
OTELCOL_QUEUE_CAPACITY = "otelcol_exporter_queue_capacity"
OTELCOL_ACCEPTED_SPANS = "otelcol_receiver_accepted_spans"
OTELCOL_REFUSED_SPANS = "otelcol_receiver_refused_spans"
OTELCOL_NAMES = (OTELCOL_UP, OTELCOL_QUEUE_SIZE, OTELCOL_QUEUE_CAPACITY, OTELCOL_ACCEPTED_SPANS, OTELCOL_REFUSED_SPANS)

# The Flink cluster's own metrics: its OpenTelemetry reporter pushes them to the sink collector, which writes them
# to Prometheus (the stack's Flink config lists which). Flink's names (2.2), scope joined with "_"; gauges only:
# the reporter sends counters as deltas, which remote write cannot carry. Labelled job_name, operator_name, ...
FLINK_JOB_RUNNING = "flink_jobmanager_job_runningState"
FLINK_RESTARTS = "flink_jobmanager_job_numRestarts"
FLINK_CHECKPOINT_DURATION = "flink_jobmanager_job_lastCheckpointDuration"
FLINK_CHECKPOINT_SIZE = "flink_jobmanager_job_lastCheckpointSize"
FLINK_CHECKPOINTS_FAILED = "flink_jobmanager_job_numberOfFailedCheckpoints"
FLINK_CHECKPOINTS_COMPLETED = "flink_jobmanager_job_numberOfCompletedCheckpoints"
FLINK_PENDING_RECORDS = "flink_taskmanager_job_task_operator_pendingRecords"
# Kafka's broker through Prometheus' JMX exporter (a Java agent in the native stack's broker, scraped as job "kafka";
# names from stack/config/kafka/jmx-exporter.yaml). Compose's Kafka image runs no agent: these panels are empty there.
KAFKA_JOB = "kafka"
KAFKA_MESSAGES_IN = "kafka_topic_messages_in_total"
KAFKA_BYTES_IN = "kafka_topic_bytes_in_total"
KAFKA_NAMES = (KAFKA_MESSAGES_IN, KAFKA_BYTES_IN)
FLINK_NAMES = (FLINK_JOB_RUNNING, FLINK_RESTARTS, FLINK_CHECKPOINT_DURATION, FLINK_CHECKPOINT_SIZE,
               FLINK_CHECKPOINTS_FAILED, FLINK_CHECKPOINTS_COMPLETED, FLINK_PENDING_RECORDS)

# The quality dashboard's lines and the guardrail alert's bound (docs/dashboards.md). The simulated healthy fleet
# scores ~0.84 composite, passes ~97 % on relevance and flags ~2 % (refusals) and ~0.5 % (PII).
COMPOSITE_FLOOR = 0.75
PASS_RATIO_FLOOR = 0.9
GUARDRAIL_FLAG_BOUND = 0.1  # a guardrail flagging over 10 % of answers, averaged over 10 minutes


def quantile_gauge(field: str) -> str:
    """The metrics job's per-window sketch quantile of a record field (``ttft_s`` ...)."""
    return P.prom(P.DISTRIBUTIONS[field][0] + P.WINDOW_QUANTILE_SUFFIX)


def pod_gauge(metric: str) -> str:
    """The roll-up over pods of a pod gauge (``M.QUEUE_DEPTH`` ...)."""
    return P.prom(P.POD_GAUGES[metric].name)


def sel(*extra: str, deployment: bool = True, regions: bool = True) -> str:
    """A label selector over the dashboard's variables: per-region series only (the roll-ups are excluded,
    so sums do not count a request twice); ``deployment`` adds model/version/track."""
    parts = []
    if regions:
        parts += [f'{REGION}!="{P.GLOBAL_REGION}"', f'{REGION}=~"$region"']
    if deployment:
        parts += [f'{MODEL}!="{P.ALL_DEPLOYMENTS}"', f'{MODEL}=~"$model"', f'{VERSION}=~"$version"',
                  f'{TRACK}=~"$track"']
    parts += list(extra)
    return "{" + ", ".join(parts) + "}"


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> pq.Dataquery:
    q = pq.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute thresholds: ``(None, "green")`` is the base step, then ``(value, color)`` from there up."""
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def timeseries_panel(title: str, description: str, unit: str, steps: db.ThresholdsConfig,
                     *targets: pq.Dataquery, line: bool = True) -> timeseries.Panel:
    """A time series with its unit, thresholds drawn as lines (the SLO line where there is one)."""
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .thresholds(steps)
             .thresholds_style(cb.GraphThresholdsStyleConfig().mode(
                 cm.GraphThresholdsStyleMode.DASHED if line else cm.GraphThresholdsStyleMode.OFF))
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
             .height(8).span(12))
    for t in targets:
        panel = panel.with_target(t)
    return panel


def stat_panel(title: str, description: str, unit: str, steps: db.ThresholdsConfig,
               *targets: pq.Dataquery) -> stat.Panel:
    """A single number per series (last value), coloured by its thresholds."""
    panel = (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .thresholds(steps).color_mode(cm.BigValueColorMode.BACKGROUND)
             .graph_mode(cm.BigValueGraphMode.AREA)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .height(5).span(6))
    for t in targets:
        panel = panel.with_target(t)
    return panel


def variables(metric: str = REQUESTS, names: tuple[str, ...] = tuple(VARIABLES)) -> list[db.QueryVariable]:
    """Multi-select variables over the per-region, per-deployment series of ``metric`` (All by default).
    Each filters on what the ones before it chose, so a model lists only its versions."""
    out = []
    chosen: list[str] = [f'{REGION}!="{P.GLOBAL_REGION}"', f'{MODEL}!="{P.ALL_DEPLOYMENTS}"']
    for name in names:
        label = VARIABLES[name]
        out.append(
            db.QueryVariable(name).label(name).datasource(DATASOURCE)
            .query({"query": f"label_values({metric}{{{', '.join(chosen)}}}, {label})", "refId": name})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all")))
        chosen.append(f'{label}=~"${name}"')
    return out


def dashboard(uid: str, title: str, description: str, tags: list[str]) -> db.Dashboard:
    return (db.Dashboard(title).uid(uid).description(description).tags(["infersight", *tags])
            .timezone("utc").time("now-1h", "now").refresh("30s").readonly()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR))


def compose(dash: db.Dashboard, sections: list[tuple[str, list]]) -> db.Dashboard:
    """Rows of panels, laid out left to right by their span, wrapping at Grafana's 24 columns; panel ids numbered
    in order (stable JSON). Positions are ours: the SDK's layout puts a panel that does not fit past the 24th
    column instead of wrapping it."""
    next_id, y = 1, 0
    for title, panels in sections:
        dash = dash.with_row(db.Row(title).id(next_id).grid_pos(dm.GridPos(h=1, w=24, x=0, y=y)))
        next_id, y, x, row_h = next_id + 1, y + 1, 0, 0
        for panel in panels:
            size = panel.build().grid_pos
            if x + size.w > 24:
                x, y, row_h = 0, y + row_h, 0
            dash = dash.with_panel(panel.id(next_id).grid_pos(dm.GridPos(h=size.h, w=size.w, x=x, y=y)))
            next_id, x, row_h = next_id + 1, x + size.w, max(row_h, size.h)
        y += row_h
    return dash

"""Final canary verdicts as MLflow runs, where teams approve model versions (the ``mlflow`` extra).

One run per rollout's final verdict in a real tracking store (``sqlite:///path/mlflow.db``, or a tracking
server's URL), tagged with the model, the canary version, the region and the verdict; each judged metric's
shift, interval, p-value and sample sizes as metrics; the whole event as the artifact ``verdict.json``.
Idempotent: a verdict already logged (same rollout, same bake start) is not logged again, so a restarted
verdict service, which replays the compacted topic, logs only what it missed. MLflow's client, not its
fluent API: the service logs from a worker thread, and the fluent API keeps an active run per process."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infersight.schemas.canary import VERDICT_CODE

EXPERIMENT = "infersight-canary"
TAG_VERDICT_ID = "infersight.verdict_id"  # hash of (rollout, bake start): a filter-safe key
ARTIFACT = "verdict.json"
RUN_METRICS = ("shift", "ci_low", "ci_high", "p_value", "n_canary", "n_stable")
MAX_TAG = 5000  # MLflow's limit on a tag's value


def artifact_location(tracking_uri: str) -> str | None:
    """Beside a SQLite store's file (MLflow's default is ``./mlruns`` under whatever the working folder is);
    a tracking server keeps its own."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlflow-artifacts").resolve().as_uri()


def verdict_id(event: dict[str, Any]) -> str:
    return hashlib.sha256(f"{event.get('rollout')}|{event.get('start_ns')}".encode()).hexdigest()[:32]


class MlflowVerdicts:
    """Logs final verdict events into ``experiment`` of the tracking store at ``tracking_uri``."""

    def __init__(self, tracking_uri: str, experiment: str = EXPERIMENT) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=artifact_location(tracking_uri))

    def run_of(self, event: dict[str, Any]) -> str | None:
        """The run already logged for this verdict, if any."""
        runs = self.client.search_runs([self.experiment_id], f"tags.`{TAG_VERDICT_ID}` = '{verdict_id(event)}'",
                                       max_results=1)
        return runs[0].info.run_id if runs else None

    def log(self, event: dict[str, Any]) -> str:
        """The run of this final verdict: found, or logged now."""
        from mlflow.entities import Metric, Param, RunTag

        existing = self.run_of(event)
        if existing is not None:
            return existing
        tags = {TAG_VERDICT_ID: verdict_id(event), "infersight.rollout": str(event.get("rollout")),
                "model": str(event.get("model")), "canary_version": str(event.get("canary_version")),
                "region": str(event.get("region")), "verdict": str(event.get("verdict")),
                "stable_versions": ",".join(map(str, event.get("stable_versions") or [])),
                "reasons": "; ".join(map(str, event.get("reasons") or []))[:MAX_TAG]}
        run = self.client.create_run(self.experiment_id, run_name=str(event.get("rollout")), tags=tags)
        run_id = run.info.run_id
        at_ms = int(event.get("at_ns") or time.time_ns()) // 1_000_000
        metrics = [Metric(f"{m['metric']}.{key}", float(m[key]), at_ms, 0)
                   for m in event.get("metrics") or [] for key in RUN_METRICS if m.get(key) is not None]
        metrics += [Metric("verdict_code", float(VERDICT_CODE.get(str(event.get("verdict")), -1)), at_ms, 0)]
        params = [Param(k, str(event[k])) for k in ("bake_s", "elapsed_s", "look") if event.get(k) is not None]
        params += [Param(f"{m['metric']}.status", str(m.get("status"))) for m in event.get("metrics") or []]
        self.client.log_batch(run_id, metrics=metrics, params=params, tags=[RunTag("mlflow.note.content",
                                                                                 _note(event))])
        self.client.log_dict(run_id, event, ARTIFACT)
        self.client.set_terminated(run_id)
        return run_id


def _note(event: dict[str, Any]) -> str:
    """The run's description in MLflow's UI: the verdict and why."""
    reasons = "\n".join(f"- {r}" for r in event.get("reasons") or [])
    return f"Canary verdict **{event.get('verdict')}** for {event.get('rollout')}\n\n{reasons}"[:MAX_TAG]


def background_logger(tracking_uri: str, experiment: str = EXPERIMENT,
                      log: Callable[[str], None] = print) -> Callable[[dict[str, Any]], None]:
    """A callback that queues final verdicts for a worker thread which logs them (the topic's reader never
    waits on MLflow); a failure is logged, never raised, and the verdict is tried again on the next final
    event of any rollout."""
    pending: queue.Queue[dict[str, Any]] = queue.Queue()

    def work() -> None:
        store: MlflowVerdicts | None = None
        retry: list[dict[str, Any]] = []
        while True:
            retry.append(pending.get())
            try:
                store = store or MlflowVerdicts(tracking_uri, experiment)
                while retry:
                    run_id = store.log(retry[0])
                    log(f"mlflow: verdict of {retry.pop(0).get('rollout')} in run {run_id}")
            except Exception as exc:  # noqa: BLE001 - a tracking store that is down must not stop the service
                log(f"mlflow: logging {len(retry)} verdict(s) to {tracking_uri} failed: {type(exc).__name__}: {exc}")

    threading.Thread(target=work, name="mlflow-verdicts", daemon=True).start()
    return pending.put

"""Final canary verdicts as runs in a real MLflow tracking store (SQLite, as a team's own server would keep them):
tags, per-metric results, the event as an artifact; one run per verdict however often it is replayed; and the
verdict service's path to it (final events only, from a worker thread)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infersight.schemas import canary as C
from infersight.stack.verdict_service import Verdicts

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra (installed by bin/infersight)")

from infersight.stack.verdict_mlflow import MlflowVerdicts, background_logger  # noqa: E402


def final_event(model="org/llama", version="v2", region="all", verdict="fail", start_ns=1_000, final=True):
    return {"rollout": C.rollout_id(model, version, region), "model": model, "canary_version": version,
            "region": region, "stable_versions": ["v1"], "verdict": verdict, "final": final,
            "reasons": ["ttft_s: +31% (critical)"], "look": 20, "elapsed_s": 600.0, "bake_s": 600.0,
            "start_ns": start_ns, "at_ns": 601 * 10**9,
            "metrics": [{"metric": "ttft_s", "status": "fail", "shift": 0.31, "ci_low": 0.25, "ci_high": 0.37,
                         "p_value": 1e-9, "n_canary": 4000, "n_stable": 36000},
                        {"metric": "error_ratio", "status": "insufficient", "shift": None, "ci_low": None,
                         "ci_high": None, "p_value": None, "n_canary": 3, "n_stable": 40}]}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_a_final_verdict_is_one_run_with_its_tags_metrics_and_event(store_uri):
    store = MlflowVerdicts(store_uri, "test-verdicts")
    event = final_event()
    run_id = store.log(event)
    run = store.client.get_run(run_id)
    assert run.info.run_name == "org/llama/v2/all" and run.info.status == "FINISHED"
    assert {k: run.data.tags[k] for k in ("model", "canary_version", "region", "verdict", "stable_versions")} == \
        {"model": "org/llama", "canary_version": "v2", "region": "all", "verdict": "fail", "stable_versions": "v1"}
    assert run.data.metrics["ttft_s.shift"] == pytest.approx(0.31)
    assert run.data.metrics["ttft_s.ci_high"] == pytest.approx(0.37)
    assert run.data.metrics["verdict_code"] == C.VERDICT_CODE["fail"]
    assert "error_ratio.shift" not in run.data.metrics and run.data.metrics["error_ratio.n_canary"] == 3
    assert run.data.params["error_ratio.status"] == "insufficient"
    assert mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/verdict.json") == event
    assert run.info.artifact_uri.startswith(Path(store_uri.removeprefix("sqlite:///")).parent.as_uri())
    # replayed (a restarted service reads the compacted topic again): the same run, not a second one
    assert store.log(final_event()) == run_id
    # a new bake of the same rollout is a new verdict
    assert store.log(final_event(start_ns=2_000)) != run_id
    assert len(store.client.search_runs([store.experiment_id])) == 2


def test_the_service_sends_final_verdicts_only_to_mlflow_in_the_background(store_uri):
    logged: list[str] = []
    verdicts = Verdicts(on_final=background_logger(store_uri, "test-service", log=logged.append))
    live = final_event(model="m", verdict="pass", final=False)
    verdicts.apply(live["rollout"], live)
    done = final_event(model="m", verdict="pass")
    verdicts.apply(done["rollout"], done, replay=True)  # replayed finals are logged too (idempotently)
    deadline = time.monotonic() + 60
    while not logged and time.monotonic() < deadline:
        time.sleep(0.2)
    assert logged and logged[0].startswith("mlflow: verdict of m/v2/all in run "), logged
    store = MlflowVerdicts(store_uri, "test-service")
    runs = store.client.search_runs([store.experiment_id])
    assert [r.data.tags["verdict"] for r in runs] == ["pass"]

"""Submit infersight's jobs to a stack's Flink (skipping those already running) or stop them."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from infersight.flink_jobs import submit

# job name (as the job sets it) -> module; order matters: normalize feeds the other two.
JOBS = {
    "infersight-normalize": "infersight.flink_jobs.normalize",
    "infersight-metrics": "infersight.flink_jobs.metrics_job",
    "infersight-archive": "infersight.flink_jobs.archive",
}


def running_jobs(layout) -> dict[str, str]:
    """Job name -> id of the jobs running (or restarting) on the cluster."""
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/overview", timeout=10) as resp:
        jobs = json.loads(resp.read())["jobs"]
    return {j["name"]: j["jid"] for j in jobs if j["state"] in ("RUNNING", "CREATED", "RESTARTING", "INITIALIZING")}


def deploy(layout, archive_root: Path, log=print) -> dict[str, str]:
    """Submit every job that is not running; returns name -> job id of all of them."""
    running = running_jobs(layout)
    for name, module in JOBS.items():
        if name in running:
            log(f"[jobs] {name} already running ({running[name]})")
            continue
        args = ["--brokers", layout.kafka_bootstrap]
        if name == "infersight-archive":
            args += ["--root", str(archive_root)]
        running[name] = submit.submit(layout, module, args)
        log(f"[jobs] {name} submitted ({running[name]})")
    return {name: running[name] for name in JOBS}


def stop_all(layout, log=print) -> list[str]:
    """Stop every job with a savepoint (their Kafka transactions commit; see ``submit.stop``)."""
    running = running_jobs(layout)
    for name in JOBS:
        if name in running:
            savepoint = submit.stop(layout, running[name])
            log(f"[jobs] {name} stopped, savepoint {savepoint}" if savepoint else f"[jobs] {name} cancelled")
    return [n for n in JOBS if n in running]

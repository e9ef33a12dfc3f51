"""infersight's PyFlink jobs on a stack's Flink session cluster: submit them (``flink run``), watch their
state and checkpoints, stop them with a savepoint. ``JOBS`` names the product's jobs and their modules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from infersight.flink_jobs.common.kafka_io import KAFKA_PROPERTIES_ENV
from infersight.stack import paths
from infersight.stack.errors import StackError
from infersight.stack.security import java_properties_text, write_private

# job name (as the job sets it) -> module; order matters: normalize feeds the other two.
JOBS = {
    "infersight-normalize": "infersight.flink_jobs.normalize.job",
    "infersight-metrics": "infersight.flink_jobs.metrics.job",
    "infersight-archive": "infersight.flink_jobs.archive.job",
}


def job_jar_urls() -> list[str]:
    """The ``file://`` URLs of the jars every job needs (the Kafka connector, the zstd codec it leaves out)."""
    jars = paths.flink_job_jars()
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise StackError(f"Flink job jars are missing: {', '.join(missing)}", "run `bin/infersight setup`")
    return [j.as_uri() for j in jars]


def submit(layout, module: str, args: list[str], timeout_s: float = 180, restore_from: str | None = None,
           py_files: Sequence[str | Path] = ()) -> str:
    """Submit ``python -m <module> <args> --jars <the job jars>`` to the stack's cluster, detached; returns the
    job id. ``module`` must take ``--jars`` (``flink_jobs.common.environment``).

    ``restore_from``: a retained checkpoint (or savepoint) path to resume from, offsets and state.
    ``py_files``: files or folders shipped with the job and put on its Python path (client and workers), for a
    module the cluster's Python cannot import otherwise."""
    # The interpreter of the task managers' machine: ours natively, the image's in containers.
    python = str(getattr(layout, "flink_python", paths.venv_python()))
    cmd = [
        "bash", str(paths.pyflink_home() / "bin" / "flink"), "run", "--detached",
        "-m", f"{layout.host}:{layout.ports.flink_rest}",
        *(["--fromSavepoint", restore_from] if restore_from else []),
        "-pyexec", python, "-pyclientexec", str(paths.venv_python()),
        *(["-pyfs", ",".join(str(f) for f in py_files)] if py_files else []),
        "-pym", module, *args, "--jars", ";".join(job_jar_urls()),
    ]
    env = dict(os.environ)
    if hasattr(layout, "flink_conf_dir"):  # native stack: its client config and log folder
        env.update(FLINK_CONF_DIR=str(layout.flink_conf_dir), FLINK_LOG_DIR=str(layout.logs / "flink"))
    security = getattr(layout, "security", None)
    if security is not None and security.kafka_sasl:  # the jobs' Kafka clients: TLS + SASL (stack/security.py)
        env[KAFKA_PROPERTIES_ENV] = str(kafka_client_properties_file(layout))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    match = re.search(r"JobID ([0-9a-f]{32})", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not match:
        raise StackError(f"submitting {module} to Flink failed:\n{(proc.stdout + proc.stderr)[-2000:]}",
                         f"check the Flink logs in {layout.logs}")
    return match.group(1)


def kafka_client_properties_file(layout) -> Path:
    """The jobs' Kafka security properties (for the connector's relocated client), written into the stack's
    state folder readable by its owner only; a job reads it when it is built (``flink_jobs.common.kafka_io``)."""
    props = layout.security.java_client_properties(shaded=True)
    return write_private(layout.state_dir / "security" / "flink-kafka-client.properties", java_properties_text(props))


def _job(layout, job_id: str) -> dict:
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}", timeout=5) as resp:
        return json.loads(resp.read())


def job_state(layout, job_id: str) -> str:
    return _job(layout, job_id)["state"]


def tasks_running(layout, job_id: str) -> bool:
    """The job and every one of its tasks run (a job is RUNNING while its tasks still wait for slots)."""
    job = _job(layout, job_id)
    return job["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in job["vertices"])


def cancel(layout, job_id: str) -> None:
    """Cancel at once. Kafka transactions the job had open stay open until transaction.timeout.ms unless the
    job is restored under the same transactional-id prefix, and they block every read_committed reader of
    those partitions meanwhile: use ``stop`` unless the job is about to be restored."""
    req = urllib.request.Request(f"{layout.flink_rest_url}/jobs/{job_id}?mode=cancel", method="PATCH")
    urllib.request.urlopen(req, timeout=10).close()


def stop(layout, job_id: str, timeout_s: float = 60) -> str | None:
    """Stop with a savepoint: the final savepoint commits the sinks' Kafka transactions, so nothing lingers
    for downstream readers. Returns the savepoint path; cancels instead (returns None) if the job cannot take
    one in ``timeout_s`` (e.g. it is restarting)."""
    url = f"{layout.flink_rest_url}/jobs/{job_id}"
    try:
        req = urllib.request.Request(f"{url}/stop", data=json.dumps({"drain": False}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            trigger = json.loads(resp.read())["request-id"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{url}/savepoints/{trigger}", timeout=10) as resp:
                status = json.loads(resp.read())
            if status["status"]["id"] == "COMPLETED":
                operation = status.get("operation") or {}
                if "location" in operation:
                    return operation["location"]
                break  # failed (failure-cause): fall back to cancel
            time.sleep(0.5)
    except urllib.error.HTTPError:
        pass  # not running (already stopped, restarting): cancel below
    if job_state(layout, job_id) not in ("FINISHED", "CANCELED", "FAILED"):
        cancel(layout, job_id)
    return None


def latest_checkpoint(layout, job_id: str) -> str | None:
    """The external path of the job's latest completed checkpoint (retained on cancel), or None."""
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}/checkpoints", timeout=5) as resp:
        latest = (json.loads(resp.read()).get("latest") or {}).get("completed")
    return latest.get("external_path") if latest else None


def checkpoint_count(layout, job_id: str) -> int:
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}/checkpoints", timeout=5) as resp:
        return int(json.loads(resp.read())["counts"]["completed"])


# ---- the product's jobs ----

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
        running[name] = submit(layout, module, args)
        log(f"[jobs] {name} submitted ({running[name]})")
    return {name: running[name] for name in JOBS}


def stop_all(layout, log=print) -> list[str]:
    """Stop every job with a savepoint (their Kafka transactions commit; see ``stop``)."""
    running = running_jobs(layout)
    for name in JOBS:
        if name in running:
            savepoint = stop(layout, running[name])
            log(f"[jobs] {name} stopped, savepoint {savepoint}" if savepoint else f"[jobs] {name} cancelled")
    return [n for n in JOBS if n in running]

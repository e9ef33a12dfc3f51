"""Run infersight's PyFlink jobs on the local stack's Flink session cluster (``flink run``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

from infersight.stack import paths
from infersight.stack.errors import StackError


def execution_environment():
    """A StreamExecutionEnvironment with the Kafka connector on the job's classpath."""
    from pyflink.datastream import StreamExecutionEnvironment

    jars = paths.flink_job_jars()
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise StackError(f"Flink job jars are missing: {', '.join(missing)}", "run `bin/infersight setup`")
    env = StreamExecutionEnvironment.get_execution_environment()
    env.add_jars(*(j.as_uri() for j in jars))
    return env


def submit(layout, module: str, args: list[str], timeout_s: float = 180, restore_from: str | None = None) -> str:
    """Submit ``python -m <module> <args>`` to the stack's cluster, detached; returns the job id.

    ``restore_from``: a retained checkpoint (or savepoint) path to resume from, offsets and state."""
    # The interpreter of the task managers' machine: ours natively, the image's in containers.
    python = str(getattr(layout, "flink_python", paths.venv_python()))
    cmd = [
        "bash", str(paths.pyflink_home() / "bin" / "flink"), "run", "--detached",
        "-m", f"{layout.host}:{layout.ports.flink_rest}",
        *(["--fromSavepoint", restore_from] if restore_from else []),
        "-pyexec", python, "-pyclientexec", str(paths.venv_python()),
        "-pym", module, *args,
    ]
    env = dict(os.environ)
    if hasattr(layout, "flink_conf_dir"):  # native stack: its client config and log folder
        env.update(FLINK_CONF_DIR=str(layout.flink_conf_dir), FLINK_LOG_DIR=str(layout.logs / "flink"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    match = re.search(r"JobID ([0-9a-f]{32})", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not match:
        raise StackError(f"submitting {module} to Flink failed:\n{(proc.stdout + proc.stderr)[-2000:]}",
                         f"check the Flink logs in {layout.logs}")
    return match.group(1)


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

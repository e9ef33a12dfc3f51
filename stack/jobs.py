"""infersight's PyFlink jobs on a stack's Flink session cluster: submit them (``flink run``), watch their
state and checkpoints, stop them with a savepoint. ``JOBS`` names the product's jobs and their modules.

The native stack remembers every job it submits (``<state>/jobs.json``: module, arguments, shipped files)
until it is stopped or cancelled through this module, because its session cluster runs without a
high-availability service: a job manager that dies takes the session's jobs with it, and Flink 2.2 offers
no file-based HA store for a standalone cluster (``high-availability.type`` is NONE, ZOOKEEPER, KUBERNETES
or a factory class). ``reconcile`` (called by the stack's supervisor) submits each remembered job the job
manager no longer knows again, from its newest retained checkpoint: the Kafka offsets, the window state and
the sinks' transactional-id prefix all come back, so the outputs stay exactly once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from infersight.flink_jobs.common.kafka_io import KAFKA_PROPERTIES_ENV
from infersight.schemas.topics import ALL_TOPICS, REGION_STATUS
from infersight.stack import kafka_admin, paths, statefile
from infersight.stack.errors import StackError
from infersight.stack.security import java_properties_text, write_private

# job name (as the job sets it) -> module; order matters: normalize feeds metrics, archive and quality (its judged
# results), metrics feeds detect (window stats) and quality (the every-request drift signals).
JOBS = {
    "infersight-normalize": "infersight.flink_jobs.normalize.job",
    "infersight-metrics": "infersight.flink_jobs.metrics.job",
    "infersight-archive": "infersight.flink_jobs.archive.job",
    "infersight-detect": "infersight.flink_jobs.detect.job",
    "infersight-quality": "infersight.flink_jobs.quality.job",
    "infersight-canary": "infersight.flink_jobs.canary.job",
}
# what the stack submitted and keeps running (see the module's docstring); job states that end a job
RECORDS = "jobs.json"
TERMINAL = ("FINISHED", "FAILED", "CANCELED")
# PyFlink's thread mode starts a task manager's embedded Python (pemja) once, with the first Python task there;
# if that task is interrupted meanwhile (cancelled by a failover), pemja keeps the InterruptedException and
# throws it at every later Python task on that task manager: alive, registered, and unable to run any job.
PYTHON_NEVER_STARTS = ("pemja.core.PythonInterpreter$MainInterpreter.initialize", "java.lang.InterruptedException")


def job_jar_urls() -> list[str]:
    """The ``file://`` URLs of the jars every job needs (the Kafka connector, the zstd codec it leaves out)."""
    jars = paths.flink_job_jars()
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise StackError(f"Flink job jars are missing: {', '.join(missing)}", "run `bin/infersight setup`")
    return [j.as_uri() for j in jars]


def submit(layout, module: str, args: list[str], timeout_s: float = 180, restore_from: str | None = None,
           py_files: Sequence[str | Path] = (), replaces: str | None = None) -> str:
    """Submit ``python -m <module> <args> --jars <the job jars>`` to the stack's cluster, detached; returns the
    job id. ``module`` must take ``--jars`` (``flink_jobs.common.environment``).

    ``restore_from``: a retained checkpoint (or savepoint) path to resume from, offsets and state.
    ``py_files``: files or folders shipped with the job and put on its Python path (client and workers), for a
    module the cluster's Python cannot import otherwise. ``replaces``: the id of the job this one continues
    (``reconcile``), whose record it takes over."""
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
    job_id = match.group(1)
    _remember(layout, job_id, {"module": module, "args": list(args), "py_files": [str(f) for f in py_files]},
              replaces)
    return job_id


# ---- what the stack submitted (native stack only: a layout with a state folder) ----

def _records_path(layout) -> Path | None:
    state_dir = getattr(layout, "state_dir", None)
    return Path(state_dir) / RECORDS if state_dir is not None else None


def _change_records(layout, change: Callable[[dict], None]) -> None:
    path = _records_path(layout)
    if path is None:
        return
    with statefile.locked(path.parent):
        records = statefile.read_json(path)
        change(records)
        statefile.write_json(path, records)


def _remember(layout, job_id: str, record: dict, replaces: str | None = None) -> None:
    def change(records: dict) -> None:
        if replaces is not None:
            old = records.pop(replaces, None) or {}
            record["recovered"] = int(old.get("recovered", 0)) + 1
        records[job_id] = record

    _change_records(layout, change)


def forget(layout, job_id: str) -> None:
    _change_records(layout, lambda records: records.pop(job_id, None))


def _group_id(layout, job_id: str) -> str:
    """The consumer group id (and transactional-id prefix) the job runs under: its ``--group-id`` argument, or
    the job's default, its name."""
    try:
        job = _job(layout, job_id)
    except (OSError, ValueError):
        job = {}
    args = (remembered(layout).get(job_id) or {}).get("args") or []
    if "--group-id" in args[:-1]:
        return args[args.index("--group-id") + 1]
    return job.get("name", "")


def forget_all(layout) -> None:
    """The cluster is going down (``Stack.down``): its jobs go with it, not to be resubmitted."""
    _change_records(layout, lambda records: records.clear())


def remembered(layout) -> dict[str, dict]:
    """Job id -> {module, args, py_files, recovered (times resubmitted)} of the jobs the stack keeps running."""
    path = _records_path(layout)
    return statefile.read_json(path) if path is not None else {}


def retained_checkpoints(layout, job_id: str) -> list[Path]:
    """The job's completed checkpoints on disk, newest first (a checkpoint is complete once its
    ``_metadata`` is written: the job manager writes it last)."""
    root = layout.data / "flink" / "checkpoints" / job_id
    found = [d for d in root.glob("chk-*") if (d / "_metadata").is_file()]
    return sorted(found, key=lambda d: int(d.name.removeprefix("chk-")), reverse=True)


def reconcile(layout, log=print, should_stop: Callable[[], bool] = lambda: False,
              running_timeout_s: float = 240.0) -> dict[str, str | None]:
    """Make the cluster run every job the stack remembers: drop the records of jobs that ended, and submit
    each job the job manager does not know again, from its newest retained checkpoint (the next older one
    if that one fails to restore). Returns old id -> new id of the jobs resubmitted (None: none restored)."""
    records = remembered(layout)
    if not records:
        return {}
    try:
        with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/overview", timeout=5) as resp:
            known = {j["jid"]: j["state"] for j in json.loads(resp.read())["jobs"]}
    except (OSError, ValueError, KeyError):
        return {}  # the job manager is not answering (yet): next time
    lost = {}
    for job_id, record in records.items():
        state = known.get(job_id)
        if state in TERMINAL:
            log(f"[jobs] {record['module']} ({job_id}) {state}: no longer kept running")
            forget(layout, job_id)
        elif state is None:
            lost[job_id] = record
    if not lost or should_stop():
        return {}
    from concurrent.futures import ThreadPoolExecutor

    # side by side: each submission is mostly a client JVM and Python starting, waiting on each other's CPU
    with ThreadPoolExecutor(len(lost)) as pool:
        futures = {job_id: pool.submit(_resubmit, layout, job_id, record, log, running_timeout_s)
                   for job_id, record in lost.items()}
    return {job_id: future.result() for job_id, future in futures.items()}


def task_managers_without_python(layout) -> dict[str, float]:
    """Task manager id -> when (unix s) a task there last failed because its embedded Python can never start
    (``PYTHON_NEVER_STARTS``), from the jobs' exception histories; empty when the job manager does not answer."""
    found: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/overview", timeout=5) as resp:
            job_ids = [j["jid"] for j in json.loads(resp.read())["jobs"] if j["state"] not in TERMINAL]
        for job_id in job_ids:
            with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}/exceptions?maxExceptions=10",
                                        timeout=5) as resp:
                entries = (json.loads(resp.read()).get("exceptionHistory") or {}).get("entries") or []
            for entry in [e for root in entries for e in (root, *(root.get("concurrentExceptions") or ()))]:
                trace, tm = entry.get("stacktrace") or "", entry.get("taskManagerId")
                if tm and all(mark in trace for mark in PYTHON_NEVER_STARTS):
                    found[tm] = max(found.get(tm, 0.0), float(entry.get("timestamp") or 0) / 1000)
    except (OSError, ValueError, KeyError):
        return {}
    return found


def _resubmit(layout, job_id: str, record: dict, log, running_timeout_s: float) -> str | None:
    """Submit a lost job again from its newest retained checkpoint, or from the one before if that one does not
    restore (a job manager killed while writing a checkpoint's metadata). Only a job that never completed a
    checkpoint starts afresh (from its consumer group's committed offsets). Returns the id it runs under, or
    None when it could not be resubmitted (its record is dropped then, and the log says why)."""
    checkpoints = retained_checkpoints(layout, job_id)
    current = job_id
    candidates: list[Path | None] = [*checkpoints[:2]] or [None]
    for path in candidates:
        source = str(path) if path else "its committed offsets (it had no completed checkpoint)"
        try:
            new_id = submit(layout, record["module"], record["args"], restore_from=str(path) if path else None,
                            py_files=record.get("py_files", ()), replaces=current)
        except (StackError, OSError, subprocess.SubprocessError) as exc:
            log(f"[jobs] {record['module']} ({job_id}) could not be resubmitted from {source}: "
                f"{str(exc).strip().splitlines()[-1][:300]}")
            continue
        log(f"[jobs] {record['module']} ({job_id}) lost with the job manager: resubmitted as {new_id} from {source}")
        current = new_id
        if _started(layout, new_id, running_timeout_s):
            return new_id
        log(f"[jobs] {new_id} failed to restore from {source}")
    log(f"[jobs] {record['module']} ({job_id}) NOT running: no retained checkpoint restored; it is no longer "
        f"kept running (see {layout.logs}; `infersight jobs` submits it afresh)")
    forget(layout, current)
    return None


def _started(layout, job_id: str, timeout_s: float) -> bool:
    """False if the job fails while it starts; True once it runs (or is still starting at the time-out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = job_state(layout, job_id)
        except (OSError, ValueError, KeyError):
            state = None
        if state in ("FAILED", "FAILING"):
            return False
        if state in ("RUNNING", "RESTARTING", "FINISHED", "CANCELED"):
            return True
        time.sleep(1)
    return True


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
    forget(layout, job_id)


def stop(layout, job_id: str, timeout_s: float = 60) -> str | None:
    """Stop with a savepoint: the final savepoint commits the sinks' Kafka transactions, so nothing lingers
    for downstream readers. Returns the savepoint path; cancels instead (returns None) if the job cannot take
    one in ``timeout_s`` (e.g. it is restarting)."""
    group_id = _group_id(layout, job_id)
    forget(layout, job_id)  # stopped on purpose: not to be resubmitted
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
        fence_lingering_transactions(layout, job_id, group_id)
    return None


def sink_transactional_ids(group_id: str, parallelism: int, last_checkpoint: int, ahead: int = 3) -> list[str]:
    """The ids under which a job's exactly-once sinks (``flink_jobs.common.kafka_io.kafka_sink``: prefix
    ``<group id>-<topic>``) may hold open transactions after ``last_checkpoint``: the Kafka connector names them
    ``<prefix>-<subtask>-<checkpoint id>``, one transaction per subtask and checkpoint, the next ones after the
    newest completed checkpoint still open (``ahead`` covers checkpoints triggered but never completed)."""
    return [f"{group_id}-{topic.name}-{subtask}-{checkpoint}" for topic in ALL_TOPICS
            for subtask in range(parallelism) for checkpoint in range(last_checkpoint + 1, last_checkpoint + 1 + ahead)]


def fence_lingering_transactions(layout, job_id: str, group_id: str) -> int:
    """After cancelling a job for good, abort the Kafka transactions it left open (a stop with a savepoint
    commits them; a cancel leaves them to block read_committed readers until ``transaction.timeout.ms``).
    Returns how many transactional ids were fenced (0 when the job manager no longer knows the job)."""
    try:
        job = _job(layout, job_id)
        with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}/checkpoints", timeout=5) as resp:
            latest = json.loads(resp.read()).get("latest") or {}
    except (OSError, ValueError):
        return 0
    if not group_id:
        return 0
    last = max([int((latest.get(kind) or {}).get("id") or 0) for kind in ("completed", "restored")])
    parallelism = max([int(v.get("parallelism", 1)) for v in job.get("vertices", [])] or [1])
    return kafka_admin.fence_transactions(layout.kafka_bootstrap, sink_transactional_ids(group_id, parallelism, last),
                                          security=getattr(layout, "security", None))


def latest_checkpoint(layout, job_id: str) -> str | None:
    """The external path of the job's latest completed checkpoint (retained on cancel), or None.

    The REST answer is cached for a few seconds (rest.cache.checkpoint-statistics.timeout): right after a cancel
    it can name a checkpoint that a newer one has already replaced and deleted (normalize checkpoints every
    second). Where the checkpoints are on this machine (the native stack), the newest complete one on disk is
    the truth; restoring an older one would replay output its successor already committed."""
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}/checkpoints", timeout=5) as resp:
        latest = (json.loads(resp.read()).get("latest") or {}).get("completed")
    on_disk = _newest_checkpoint_on_disk(layout, job_id)
    if on_disk is not None:
        return on_disk.as_uri()
    return latest.get("external_path") if latest else None


def _newest_checkpoint_on_disk(layout, job_id: str) -> Path | None:
    data = getattr(layout, "data", None)
    if data is None:
        return None
    complete = [(int(d.name[4:]), d) for d in (Path(data) / "flink" / "checkpoints" / job_id).glob("chk-*")
                if d.name[4:].isdigit() and (d / "_metadata").is_file()]  # _metadata is written last
    return max(complete)[1] if complete else None


def checkpoint_count(layout, job_id: str) -> int:
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/{job_id}/checkpoints", timeout=5) as resp:
        return int(json.loads(resp.read())["counts"]["completed"])


# ---- the product's jobs ----

def running_jobs(layout) -> dict[str, str]:
    """Job name -> id of the jobs running (or restarting) on the cluster."""
    with urllib.request.urlopen(f"{layout.flink_rest_url}/jobs/overview", timeout=10) as resp:
        jobs = json.loads(resp.read())["jobs"]
    return {j["name"]: j["jid"] for j in jobs if j["state"] in ("RUNNING", "CREATED", "RESTARTING", "INITIALIZING")}


def job_args(name: str, brokers: str, archive_root: str, source_topics: Sequence[str] = ()) -> list[str]:
    """The arguments a job is submitted with (before ``--jars``): natively and in the Helm chart's
    ``FlinkDeployment``s. ``source_topics``: the OTLP topics normalize reads where they are not the
    regional names (the global cluster's mirrored ``<region>.infersight.otlp.*``). Detect reads the region status
    topic (empty in the single-region topology), named here so the chart says it too."""
    args = ["--brokers", brokers]
    if name == "infersight-archive":
        args += ["--root", archive_root]
    if name == "infersight-normalize" and source_topics:
        args += ["--source-topics", ",".join(source_topics)]
    if name == "infersight-detect":
        args += ["--region-status-topic", REGION_STATUS.name]
    return args


def deploy(layout, archive_root: Path, log=print, extra_args: Mapping[str, Sequence[str]] | None = None,
           only: Sequence[str] | None = None) -> dict[str, str]:
    """Submit every job (of ``only``, when given) that is not running (``extra_args``: more arguments per job name,
    e.g. the demo's); returns name -> job id of all of them."""
    names = list(JOBS) if only is None else list(only)
    running = running_jobs(layout)
    for name in names:
        module = JOBS[name]
        if name in running:
            log(f"[jobs] {name} already running ({running[name]})")
            continue
        sources = getattr(layout, "normalize_sources", list)()  # multi-region: the mirrored topics
        args = [*job_args(name, layout.kafka_bootstrap, str(archive_root), sources), *(extra_args or {}).get(name, ())]
        running[name] = submit(layout, module, args)
        log(f"[jobs] {name} submitted ({running[name]})")
    return {name: running[name] for name in names}


def wait_running(layout, job_ids: Iterable[str], timeout_s: float = 300.0) -> None:
    """Return once every job and all its tasks run; a RuntimeError naming the logs after ``timeout_s``."""
    job_ids = list(job_ids)
    deadline = time.monotonic() + timeout_s
    while not all(tasks_running(layout, j) for j in job_ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the jobs {job_ids} did not run within {timeout_s:.0f} s; logs in {layout.logs}")
        time.sleep(2)


def stop_all(layout, log=print) -> list[str]:
    """Stop every job with a savepoint (their Kafka transactions commit; see ``stop``)."""
    running = running_jobs(layout)
    for name in JOBS:
        if name in running:
            savepoint = stop(layout, running[name])
            log(f"[jobs] {name} stopped, savepoint {savepoint}" if savepoint else f"[jobs] {name} cancelled")
    return [n for n in JOBS if n in running]

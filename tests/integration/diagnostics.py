"""What the stack looked like when an integration test failed: component health, Flink jobs with their
vertex states and latest exceptions, the sink's lag on infersight.metrics, and the error lines of the
component logs. CI keeps only pytest's output, so a failure report must carry the cause with it."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

ERROR_LINE = re.compile(r"\b(error|fatal|exception|panic|outofmemory|killed)\b", re.IGNORECASE)
INFO_LINE = re.compile(r"\bINFO\b|\tinfo\t|level=info", re.IGNORECASE)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def flink_jobs(rest_url: str, newest: int = 8) -> list[str]:
    lines = []
    try:
        jobs = sorted(_get(f"{rest_url}/jobs/overview")["jobs"], key=lambda j: j["start-time"])[-newest:]
    except OSError as exc:
        return [f"flink REST unreachable: {exc}"]
    for job in jobs:
        jid = job["jid"]
        try:
            vertices = _get(f"{rest_url}/jobs/{jid}")["vertices"]
            states = ", ".join(f"{v['name'][:40]}={v['status']}" for v in vertices)
            root = (_get(f"{rest_url}/jobs/{jid}/exceptions").get("exceptionHistory") or {}).get("entries") or []
            cause = root[0]["stacktrace"].strip().splitlines()[:6] if root else []
        except (OSError, KeyError) as exc:
            states, cause = f"unreadable: {exc}", []
        lines.append(f"job {job['name']} {jid[:8]} {job['state']} tasks {job.get('tasks')}: {states}")
        lines += [f"    {c}" for c in cause]
    return lines


def log_errors(logs: Path, per_file: int = 12) -> list[str]:
    lines = []
    for path in sorted([*logs.glob("*.log"), *logs.glob("flink/*client*.log")]):  # flink/ repeats the rest
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        hits = [line[:300] for line in text if ERROR_LINE.search(line) and not INFO_LINE.search(line)]
        if hits:
            lines.append(f"{path.name}: {len(hits)} error lines, the last {min(per_file, len(hits))}:")
            lines += [f"    {h}" for h in hits[-per_file:]]
    return lines


def consumer_lag(bootstrap: str, group: str, topic: str) -> str:
    """How far a consumer group (the sink's) is behind a topic's end, per partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=5).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=5)
        lag = {tp.partition: consumer.get_watermark_offsets(tp, timeout=5)[1] - max(tp.offset, 0) for tp in committed}
        return f"{group} behind {topic} by {lag} messages"
    except Exception as exc:  # a report must never hide the test's own failure
        return f"{group} lag on {topic} unreadable: {exc!r}"
    finally:
        consumer.close()


def stack_report(stack) -> str:
    lines = ["components:"]
    try:
        lines += [f"    {s.name} running={s.running} healthy={s.healthy}" for s in stack.status()]
    except Exception as exc:  # a report must never hide the test's own failure
        lines.append(f"    unreadable: {exc!r}")
    lines += flink_jobs(stack.layout.flink_rest_url)
    lines.append(consumer_lag(stack.layout.kafka_bootstrap, "infersight-sink", "infersight.metrics"))
    lines += log_errors(stack.layout.logs)
    return "\n".join(lines)


def watermarks(rest_url: str, job_id: str) -> dict[str, float]:
    """Each vertex's lowest subtask input watermark, in seconds (what decides whether a window can close)."""
    out = {}
    try:
        for v in _get(f"{rest_url}/jobs/{job_id}")["vertices"]:
            marks = [float(m["value"]) for m in _get(f"{rest_url}/jobs/{job_id}/vertices/{v['id']}/watermarks")]
            if marks:
                out[v["name"][:40]] = min(marks) / 1000
    except (OSError, KeyError, ValueError) as exc:
        out[f"unreadable: {exc}"] = 0.0
    return out


def vertex_metrics(rest_url: str, job_id: str, vertex: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sums over the subtasks of the vertices whose name contains ``vertex``, of every metric whose id ends with
    one of ``names`` (a task's ``numRecordsIn``, an operator's ``unit-cost.numLateRecordsDropped``, a Python
    function's ``catchup_windows``: operator metrics carry their operator's name in the id)."""
    out: dict[str, float] = {}
    try:
        for v in _get(f"{rest_url}/jobs/{job_id}")["vertices"]:
            if vertex not in v["name"]:
                continue
            url = f"{rest_url}/jobs/{job_id}/vertices/{v['id']}/subtasks/metrics"
            ids = [m["id"] for m in _get(url) if m["id"].endswith(names)]
            if ids:
                for m in _get(f"{url}?get={urllib.parse.quote(','.join(ids))}&agg=sum"):
                    out[m["id"]] = out.get(m["id"], 0.0) + float(m["sum"])
    except (OSError, KeyError, ValueError) as exc:
        out[f"unreadable: {exc}"] = 0.0
    return out


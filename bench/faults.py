"""Crash faults under load: ``kill -9`` of the Kafka broker, of a regional gateway, of a Flink task manager
and of the Flink job manager, one after the other, while the fleet simulator sends 2,000 requests/s
through the whole pipeline; nothing but the stack's own supervisor brings them back.

    .venv/bin/python -m bench.faults             # 60 s of load before each kill, 60 s after it recovered
    .venv/bin/python -m bench.faults --quick     # 20 s before, 20 s after
    .venv/bin/python -m bench.faults --faults kafka_kill9,jobmanager_kill9 --rate 1000

Starts its own stack (fresh, free ports, a temporary folder), deploys the jobs as ``infersight up`` does
(``stack.jobs.deploy``: the jobs the supervisor keeps running), and stops it at the end. Each fault has its
own model names (its own simulator run), so its requests are counted apart. Per fault:

- ``sent``: requests in that run's ledger; ``lost`` / ``double``: summed per series (region, model,
  version, track) of Prometheus' counters against the ledger, each on its own, never netted
  (``tests/support/pipeline_load.tally``), once every run has settled after the load stopped;
- ``recovery_s``: from the kill until, in every region, Prometheus counts requests sent after the kill
  (the region's counter passes what the ledger had sent there at the kill; polled every second). With no
  fault this takes one window plus the pipeline's lag: ``no_fault_recovery_s`` measures it the same way;
- ``component_back_s``: from the kill until the killed component is healthy again (for the job manager:
  and every job running again), with ``restarts`` as ``infersight status`` shows it.

Writes bench/results/faults.json (through ``bench.results_file.save_results``: machine, commit, command).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.results_file import save_results
from tests.support.pipeline_load import counted_per_region, fleet, keep_event_time_moving, settle, task_manager_of

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "faults.json"
FAULTS = ("kafka_kill9", "gateway_kill9", "taskmanager_kill9", "jobmanager_kill9")
GATEWAY_REGION = 1  # eu-west-1: the gateway killed
VICTIM_JOB = "infersight-metrics"  # the task manager killed is the one running this job
RECOVERY_TIMEOUT_S = 420.0


def say(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def jobs_running(layout) -> bool:
    from infersight.stack import jobs

    try:
        running = jobs.running_jobs(layout)
        return all(name in running and jobs.tasks_running(layout, running[name]) for name in jobs.JOBS)
    except (OSError, ValueError, KeyError):
        return False


def victim(stack, fault: str) -> str:
    from infersight.stack import jobs

    lay = stack.layout
    return {"kafka_kill9": "kafka", "gateway_kill9": f"gateway-{lay.regions[GATEWAY_REGION]}",
            "taskmanager_kill9": task_manager_of(lay, jobs.running_jobs(lay)[VICTIM_JOB])
            if fault == "taskmanager_kill9" else "",
            "jobmanager_kill9": "flink-jobmanager", "no_fault": ""}[fault]


class RegionCounts(threading.Thread):
    """Polls one run's counters per region every second, recording when each first passes a given floor."""

    def __init__(self, prom_url: str, tag: str) -> None:
        super().__init__(daemon=True, name=f"counts-{tag}")
        self.prom_url, self.tag = prom_url, tag
        self.floor: dict[str, int] | None = None
        self.passed: dict[str, float] = {}
        self.stop_event = threading.Event()

    def arm(self, floor: dict[str, int]) -> None:
        self.passed, self.floor = {}, dict(floor)

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            if self.floor is None:
                continue
            try:
                counts = counted_per_region(self.prom_url, self.tag)
            except Exception:  # noqa: BLE001 - Prometheus busy: next poll
                continue
            now = time.time()
            for region, floor in self.floor.items():
                if counts.get(region, 0) > floor:
                    self.passed.setdefault(region, now)

    def recovered_at(self) -> float | None:
        if self.floor is None or set(self.passed) != set(self.floor):
            return None
        return max(self.passed.values())


def run_fault(stack, fault: str, rate: float, before_s: float, after_s: float) -> dict[str, Any]:
    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator

    lay = stack.layout
    tag = uuid.uuid4().hex[:6]
    sim = Simulator(fleet(tag, rate), endpoints_of(stack), seed=11 + [*FAULTS, "no_fault"].index(fault)).start()
    counts = RegionCounts(lay.prometheus_url, tag)
    counts.start()
    try:
        time.sleep(before_s)
        name = victim(stack, fault)
        component = {c.name: c for c in stack.layout.components()}.get(name)
        restarts = lambda: getattr(stack.restart_book().records.get(name), "restarts", 0)  # noqa: E731
        restarts_before = restarts()
        pid = stack.running_components().get(name) if name else None
        if name and pid is None:
            raise RuntimeError(f"{name} is not running before {fault}")
        counts.arm(dict(sim.snapshot().by("region")))
        killed_at = time.time()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            say(f"{fault}: kill -9 {name} (pid {pid}) at {rate:,.0f} requests/s")
        back_at = None if name else killed_at
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline and (back_at is None or counts.recovered_at() is None):
            time.sleep(1.0)
            if back_at is None and restarts() > restarts_before and component.healthy() and (
                    name != "flink-jobmanager" or jobs_running(lay)):
                back_at = time.time()
                say(f"{fault}: {name} healthy again after {back_at - killed_at:.1f} s (restarts {restarts()})")
        recovered_at = counts.recovered_at()
        say(f"{fault}: counting again in every region after "
            f"{'never' if recovered_at is None else f'{recovered_at - killed_at:.1f} s'}")
        time.sleep(after_s)
        behind = sim.behind_s
    finally:
        delivered = sim.stop(flush_s=180)
        counts.stop_event.set()
    row = {r.name: r for r in stack.status()}.get(name) if name else None
    return {
        "tag": tag, "ledger": sim.ledger, "victim": name or None, "pid": pid,
        "recovery_s": round(recovered_at - killed_at, 1) if recovered_at else None,
        "component_back_s": round(back_at - killed_at, 1) if back_at else None,
        "recovered_per_region_s": {r: round(t - killed_at, 1) for r, t in sorted(counts.passed.items())},
        "restarts": row.restarts if row else None, "last_exit": row.last_exit if row else None,
        "delivered": delivered, "simulator_behind_s": round(behind, 2),
        "export_retries": sum(s.retries for s in sim.exporter.stats().values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 s of load before each kill and after recovery")
    parser.add_argument("--rate", type=float, default=2000.0, help="requests/s offered (default 2000)")
    parser.add_argument("--before-s", type=float, help="load before each kill (default 60; quick 20)")
    parser.add_argument("--after-s", type=float, help="load after recovery (default 60; quick 20)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--no-baseline", action="store_true", help="skip the no-fault reference run")
    args = parser.parse_args()
    before_s = args.before_s or (20.0 if args.quick else 60.0)
    after_s = args.after_s or (20.0 if args.quick else 60.0)
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}")

    from infersight.demo import endpoints_of
    from infersight.stack import jobs, setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    started = time.monotonic()
    setup.ensure_all()
    state = Path(tempfile.mkdtemp(prefix="infersight-faults-"))
    stack = Stack(state, PortPlan.free(), log=lambda _: None)
    runs: dict[str, dict[str, Any]] = {}
    tallies = {}
    try:
        stack.up()
        jobs.deploy(stack.layout, state / "archive", log=say)
        deadline = time.monotonic() + 240
        while not jobs_running(stack.layout) and time.monotonic() < deadline:
            time.sleep(2)
        # a little traffic first so the jobs are warm and windows flow before the first run counts
        warm = keep_event_time_moving(endpoints_of(stack), "warm", rate=200)
        time.sleep(20)
        warm.stop()
        for fault in ([] if args.no_baseline else ["no_fault"]) + faults:
            runs[fault] = run_fault(stack, fault, args.rate, before_s, after_s)
        say("load stopped; waiting for every run's counts to settle")
        keep = keep_event_time_moving(endpoints_of(stack))
        try:
            tallies = settle(stack.layout.prometheus_url, {r["tag"]: r["ledger"] for r in runs.values()},
                             timeout_s=600, quiet_s=90, log=say)
        finally:
            keep.stop()
        status = {r.name: {"restarts": r.restarts, "last_exit": r.last_exit, "healthy": r.healthy}
                  for r in stack.status()}
        recovered_jobs = {rec["module"]: rec.get("recovered", 0) for rec in jobs.remembered(stack.layout).values()}
    finally:
        stack.down(wipe=True)
    out: dict[str, Any] = {}
    for fault, run in runs.items():
        t = tallies.get(run["tag"])
        out[fault] = {**(t.to_json() if t else {}), **{k: v for k, v in run.items() if k not in ("ledger", "pid")}}
    result = {
        "faults": {k: v for k, v in out.items() if k != "no_fault"},
        "no_fault_recovery_s": out.get("no_fault", {}).get("recovery_s"),
        "no_fault": out.get("no_fault"),
        "rate_rps": args.rate, "before_s": before_s, "after_s": after_s, "quick": args.quick,
        "supervisor_status_at_end": status, "jobs_resubmitted": recovered_jobs,
        "definitions": {
            "lost": "sum over series (region, model, model_version, track) of max(0, ledger - Prometheus)",
            "double": "sum over series of max(0, Prometheus - ledger)",
            "recovery_s": "kill -9 -> every region's counter passes what the ledger had sent there at the kill",
            "component_back_s": "kill -9 -> the component healthy again (job manager: and every job running)",
        },
        "wall_s": round(time.monotonic() - started, 1),
    }
    save_results(RESULTS, result)
    brief = {k: {m: v.get(m) for m in ("sent", "lost", "double", "recovery_s", "component_back_s")}
             for k, v in out.items()}
    print(json.dumps(brief, indent=2))


if __name__ == "__main__":
    main()

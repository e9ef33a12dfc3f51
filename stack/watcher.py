"""The stack's supervisor process: ``python -m infersight.stack.watcher <state_dir>`` (``Stack.up`` starts it).

Every ``POLL_S`` it looks at each component recorded in ``stack.json``: a dead one is started again on the
same ports and state (the same command line, data folders and configuration) once its back-off has run out
(``stack/restarts.py``). Its restart book goes to ``supervisor.json``. While the job manager answers, it
also reconciles the Flink jobs: a job the stack submitted that the job manager no longer knows (the
session cluster keeps no jobs across a job-manager restart: it runs without a high-availability service)
is submitted again from its newest retained checkpoint (``jobs.reconcile``).

It looks at liveness (is the PID alive and ours), not at health: a process that runs but answers badly is for
``status`` to show, as Kubernetes separates liveness from readiness. One exception, a liveness probe of its own:
a task manager whose embedded Python can never start again (``jobs.PYTHON_NEVER_STARTS``: every Python task
placed there fails, and the jobs restart onto it in a loop, its slots being the free ones) is killed and so
restarted like any dead component. SIGTERM stops the supervisor (``Stack.down`` does that first); components
keep running without it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from infersight.stack import statefile
from infersight.stack.restarts import RestartBook, describe_exit
from infersight.stack.supervisor import SUPERVISOR

POLL_S = 0.5
RECONCILE_EVERY_S = 5.0
ORPHAN_AFTER_S = 10.0  # exits once stack.json has not named it for this long (down, a wiped state folder)


def log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}", flush=True)


def _exit_status(pid: int) -> int | None:
    """Reap ``pid`` if it is our child (one we restarted) and return its wait status; None otherwise."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if got == pid else None


class Watcher:
    def __init__(self, state_dir: Path) -> None:
        from infersight.stack.supervisor import SUPERVISOR_STATE, Stack

        self.stack = Stack(state_dir, log=log)
        self.components = {c.name: c for c in self.stack.layout.components()}  # built once: same ports, env
        self.book_path = state_dir / SUPERVISOR_STATE
        self.book = RestartBook.from_json(statefile.read_json(self.book_path))
        self.stopping = threading.Event()
        self.reconciling: threading.Thread | None = None
        self.last_reconcile = 0.0
        self.exits: dict[int, int] = {}
        self.reasons: dict[str, str] = {}  # component -> why the supervisor itself killed it

    def run(self) -> None:
        log(f"supervising {', '.join(self.components)} (back-off {self.book.policy})")
        named_at = time.monotonic()
        while not self.stopping.is_set():
            if self.stack._load().get(SUPERVISOR) == os.getpid():
                named_at = time.monotonic()
            elif time.monotonic() - named_at > ORPHAN_AFTER_S:
                log("stack.json no longer names this supervisor (the stack went down, or its folder went): exiting")
                break
            changed = self.poll(time.time())
            if changed:
                self.save()
            self.maybe_reconcile()
            self.stopping.wait(POLL_S)
        log("stopped")

    def reap(self) -> None:
        """Collect the exit status of every child that ended (restarted components are our children)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exits[pid] = status

    def poll(self, now: float) -> bool:
        self.reap()
        before = self.book.to_json()
        pids = self.stack._pids()
        for name, pid in pids.items():
            component = self.components.get(name)
            if component is None:
                continue
            alive = self.stack.is_ours(pid)
            status = None if alive else self.exits.pop(pid, None)
            how = None if alive else self.reasons.pop(name, None) or describe_exit(
                status if status is not None else _exit_status(pid))
            if self.book.step(name, pid, alive, now, how) and not self.stopping.is_set():
                self.restart(name, pid, now)
        for name, record in self.book.records.items():
            if name not in pids and (record.waiting or record.pid):
                self.book.forget(name)  # stopped on purpose (Stack.stop / down): not ours to restart
        return self.book.to_json() != before

    def restart(self, name: str, dead_pid: int, now: float) -> None:
        with self.stack.locked():
            pids = self.stack._pids()
            if pids.get(name) != dead_pid:  # stopped on purpose, or started by `up`, meanwhile
                return
            if self.stopping.is_set():
                return
            r = self.book.record(name)
            log(f"{name} died ({r.last_exit}); restart {r.restarts + 1} after {r.deaths_in_row} death(s) in a row")
            try:
                new_pid = self.stack._spawn(self.components[name])
            except Exception as exc:  # noqa: BLE001 - a failed prepare counts as a death; try again later
                log(f"{name}: start failed: {exc}")
                self.book.start_failed(name, now, str(exc).splitlines()[0][:200])
                return
            pids[name] = new_pid
            self.stack._save(pids)
        self.book.started(name, new_pid, now)

    def maybe_reconcile(self) -> None:
        """Resubmit lost jobs, in a thread (a submission takes seconds): one pass at a time."""
        if self.reconciling is not None and self.reconciling.is_alive():
            return
        if time.monotonic() - self.last_reconcile < RECONCILE_EVERY_S:
            return
        self.last_reconcile = time.monotonic()
        jm = self.stack._pids().get("flink-jobmanager")
        if jm is None or not self.stack.is_ours(jm):
            return
        from infersight.stack import jobs

        def reconcile() -> None:
            try:
                jobs.reconcile(self.stack.layout, log=log, should_stop=self.stopping.is_set)
                self.probe_task_managers(jobs.task_managers_without_python(self.stack.layout))
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log(f"jobs: reconcile failed: {exc}")

        self.reconciling = threading.Thread(target=reconcile, name="reconcile", daemon=True)
        self.reconciling.start()

    def probe_task_managers(self, failed_at: dict[str, float]) -> None:
        """Kill each task manager whose embedded Python failed for good since it started (the poll restarts it)."""
        for name, when in failed_at.items():
            pid = self.stack._pids().get(name)
            record = self.book.records.get(name)
            if pid is None or record is None or record.up_since is None or when <= record.up_since:
                continue  # not ours, or the failure was its predecessor's
            if self.stack.is_ours(pid):
                self.reasons[name] = "killed by the supervisor: its embedded Python (pemja) can never start"
                log(f"{name}: a Python task failed there at {time.strftime('%H:%M:%S', time.localtime(when))} "
                    f"because its embedded Python can never start (pemja keeps an interrupted start); killing it")
                os.kill(pid, signal.SIGKILL)

    def save(self) -> None:
        if not self.book_path.parent.exists():
            return
        statefile.write_json(self.book_path, {**self.book.to_json(), "supervisor_pid": os.getpid(),
                                              "updated_at": time.time()})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m infersight.stack.watcher <state_dir>", file=sys.stderr)
        return 2
    watcher = Watcher(Path(argv[0]).resolve())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: watcher.stopping.set())
    watcher.save()
    watcher.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

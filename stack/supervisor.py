"""Start, health-check, report and stop the processes of one stack, by PID, and keep them running.

State lives in ``<state_dir>/stack.json`` (ports, the PID of each component, the supervisor's PID),
changed only under the state lock (``statefile.locked``). A process counts as ours only if it is alive
and its environment carries ``INFERSIGHT_STACK=<state_dir>``, so ``down`` never signals a process that
merely reused a PID.

Who watches: ``up`` leaves a small supervisor process behind (``python -m infersight.stack.watcher``,
marked like the components, log ``logs/supervisor.log``). It restarts any component that dies, with
the back-off of ``stack/restarts.py`` (1 s doubling to 30 s, reset after 60 s up), counts restarts in
``<state_dir>/supervisor.json`` (``infersight status`` shows them), and resubmits the Flink jobs from
their newest retained checkpoints when the job manager comes back without them (``jobs.reconcile``).
A component taken out with ``stop`` (an outage on purpose) leaves ``stack.json`` first, so the
supervisor leaves it alone; ``down`` stops the supervisor before anything else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from infersight.stack import statefile
from infersight.stack.components import Component, StackLayout
from infersight.stack.errors import StackError
from infersight.stack.ports import PortPlan, port_in_use

STATE_FILE = "stack.json"
SUPERVISOR_STATE = "supervisor.json"  # the supervisor's restart book, written by it alone
SUPERVISOR = "supervisor"
MARKER = "INFERSIGHT_STACK"
START_TIMEOUT_S = 120.0


def say(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    ports: dict[str, int]
    log: Path
    restarts: int = 0                # processes the supervisor started after this one died
    last_exit: str | None = None     # how the last one ended ("killed by SIGKILL"), if one did
    restart_in_s: float | None = None  # a restart is pending, due in this many seconds


class Stack:
    """One local stack rooted at a state folder."""

    def __init__(self, state_dir: Path, ports: PortPlan | None = None, log: Callable[[str], None] = say):
        self.state_dir = state_dir.resolve()
        self.log = log
        saved = self._load()
        if ports is None:
            ports = PortPlan.from_dict(saved["ports"]) if saved.get("ports") else PortPlan.default()
        elif saved.get("pids") and saved.get("ports") and ports.to_dict() != saved["ports"]:
            if self.running_components():
                raise StackError(
                    f"the stack in {self.state_dir} is running with other ports",
                    "run `infersight down` first, or leave the port options out",
                )
        self.layout = StackLayout(self.state_dir, ports)

    # -- state ---------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def _load(self) -> dict:
        return statefile.read_json(self.state_file)

    def _save(self, pids: dict[str, int], supervisor: int | None = None) -> None:
        """Write the component PIDs (and keep the supervisor's, unless given). Callers hold the state lock."""
        state = {"ports": self.layout.ports.to_dict(), "pids": pids}
        keep = supervisor if supervisor is not None else self._load().get(SUPERVISOR)
        if keep:
            state[SUPERVISOR] = keep
        statefile.write_json(self.state_file, state)

    def locked(self):
        """The state lock: hold it to read, change and write ``stack.json`` as one step."""
        return statefile.locked(self.state_dir)

    def _pids(self) -> dict[str, int]:
        return dict(self._load().get("pids", {}))

    def is_ours(self, pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return f"{MARKER}={self.state_dir}".encode() in environ.split(b"\0")

    def running_components(self) -> dict[str, int]:
        return {name: pid for name, pid in self._pids().items() if self.is_ours(pid)}

    # -- up ------------------------------------------------------------------------------

    def up(self, timeout: float = START_TIMEOUT_S, only: Collection[str] | None = None,
           supervise: bool = True) -> float:
        """Start whatever is not running (of ``only``, if given), wait until healthy, then make sure the
        supervisor runs (unless ``supervise`` is False); returns seconds taken."""
        started_at = time.monotonic()
        components = [c for c in self.layout.components() if only is None or c.name in only]
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        with self.locked():
            running = self.running_components()
            pids = {name: pid for name, pid in self._pids().items() if name in running}
            to_start = [c for c in components if c.name not in running]
            for c in components:
                if c.name in running:
                    self.log(f"  {c.name:<26} already running (pid {running[c.name]})")
            self._check_ports_free(to_start)
            for c in to_start:
                pids[c.name] = self._spawn(c)
                self._save(pids)
        for c in components:
            self._wait_healthy(c, pids[c.name], started_at + timeout)
            if c.on_healthy is not None:
                created = c.on_healthy()
                if created:
                    self.log(f"  {c.name + ' topics':<26} created {', '.join(created)}")
        if supervise:
            self.ensure_supervisor()
        return time.monotonic() - started_at

    # -- the supervisor ----------------------------------------------------------------------

    def supervisor_pid(self) -> int | None:
        """The PID of this stack's supervisor process, if it runs."""
        pid = self._load().get(SUPERVISOR)
        return pid if pid and self.is_ours(pid) else None

    def ensure_supervisor(self) -> int | None:
        """Start the supervisor if it is not running; returns the PID of the one started, None if one ran."""
        import sys

        with self.locked():
            if self.supervisor_pid():
                return None
            log = self.layout.logs / "supervisor.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, MARKER: str(self.state_dir)}
            with open(log, "ab") as out:
                proc = subprocess.Popen([sys.executable, "-m", "infersight.stack.watcher", str(self.state_dir)],
                                        env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=self.state_dir)
            self._save(self._pids(), supervisor=proc.pid)
        self.log(f"  {'supervisor':<26} started (pid {proc.pid}), log {log}")
        return proc.pid

    def stop_supervisor(self, grace_s: float = 20.0) -> bool:
        """Stop the supervisor (first, in ``down``: it must not restart what is being stopped)."""
        with self.locked():
            pid = self.supervisor_pid()
            state = self._load()
            if state.pop(SUPERVISOR, None) is not None:
                statefile.write_json(self.state_file, state)
        if pid is None:
            return False
        _terminate(pid, grace_s)
        self.log(f"  {'supervisor':<26} stopped (pid {pid})")
        return True

    def restart_book(self):
        """The supervisor's restart records (``stack/restarts.py``), as last written by it."""
        from infersight.stack.restarts import RestartBook

        return RestartBook.from_json(statefile.read_json(self.state_dir / SUPERVISOR_STATE))

    def _check_ports_free(self, components: list[Component], wait_s: float = 15.0) -> None:
        # A port held for a moment is waited for: while a component is down (an outage, a restart), its free
        # port can be handed out as the local port of a client's connection attempt (Kafka's clients retry in a
        # storm while the broker is away); CI saw a gateway's health port taken so, for an instant.
        deadline = time.monotonic() + wait_s
        for c in components:
            for what, port in c.ports.items():
                while port_in_use(self.layout.host, port) and time.monotonic() < deadline:
                    time.sleep(0.5)
                if port_in_use(self.layout.host, port):
                    raise StackError(
                        f"port {port} ({c.name} {what}) on {self.layout.host} is already in use",
                        "stop what listens there, or start on other ports: `infersight up --base-port N`",
                    )

    def _spawn(self, c: Component) -> int:
        if c.prepare:
            try:
                c.prepare()
            except subprocess.CalledProcessError as exc:
                raise StackError(f"preparing {c.name} failed: {(exc.stderr or exc.stdout or '').strip()[-800:]}",
                                 f"see {c.log}; `infersight down --wipe` resets its data") from exc
        c.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **c.env, MARKER: str(self.state_dir)}
        with open(c.log, "ab") as out:
            proc = subprocess.Popen(c.argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.state_dir)
        self.log(f"  {c.name:<26} started (pid {proc.pid}), log {c.log}")
        return proc.pid

    def _wait_healthy(self, c: Component, pid: int, deadline: float) -> None:
        while True:
            if c.healthy():
                self.log(f"  {c.name:<26} healthy")
                return
            if not _alive(pid):
                raise StackError(f"{c.name} exited during start-up:\n{_tail(c.log)}",
                                 f"read {c.log}; fix the cause, then run `infersight up` again")
            if time.monotonic() > deadline:
                raise StackError(f"{c.name} did not become healthy in time:\n{_tail(c.log)}",
                                 f"read {c.log}; the machine may be overloaded")
            time.sleep(0.25)

    # -- status / down ---------------------------------------------------------------------

    def status(self) -> list[ComponentStatus]:
        pids = self._pids()
        book = self.restart_book()
        now = time.time()
        out = []
        for c in self.layout.components():
            pid = pids.get(c.name)
            running = pid is not None and self.is_ours(pid)
            r = book.records.get(c.name)
            due = r.restart_at if r and r.restart_at and c.name in pids and not running else None
            out.append(ComponentStatus(c.name, pid if running else None, running,
                                       running and c.healthy(), c.ports, c.log,
                                       restarts=r.restarts if r else 0, last_exit=r.last_exit if r else None,
                                       restart_in_s=max(0.0, due - now) if due else None))
        return out

    def stop(self, name: str, grace_s: float = 20.0) -> bool:
        """Stop one component (an outage, a restart); ``up()`` starts it again. False if not running.
        It leaves ``stack.json`` before it is signalled, so the supervisor does not start it again."""
        with self.locked():
            pids = self._pids()
            pid = pids.pop(name, None)
            if pid is None:
                return False
            self._save(pids)
        if not self.is_ours(pid):
            return False
        _terminate(pid, grace_s)
        self.log(f"  {name:<26} stopped (pid {pid})")
        return True

    def down(self, wipe: bool = False, grace_s: float = 20.0) -> list[str]:
        """Stop the supervisor, then the processes this stack started (newest first); returns the names
        stopped. The Flink jobs end with the cluster: their records go too (``jobs.forget_all``)."""
        from infersight.stack import jobs

        self.stop_supervisor(grace_s)
        stopped = [c.name for c in reversed(self.layout.components()) if self.stop(c.name, grace_s)]
        if self.state_dir.exists():
            with self.locked():
                self._save({})  # also forgets pids of processes that are gone or no longer ours
            jobs.forget_all(self.layout)
            (self.state_dir / SUPERVISOR_STATE).unlink(missing_ok=True)
        if wipe:
            import shutil

            shutil.rmtree(self.layout.data, ignore_errors=True)
            self.log(f"  data wiped: {self.layout.data}")
        return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process is not alive
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        if state == "Z":
            os.waitpid(pid, os.WNOHANG)
            return False
    except (OSError, ChildProcessError):
        pass
    return True


def _terminate(pid: int, grace_s: float) -> None:
    """SIGTERM the process group (the process and its children), then SIGKILL after the grace time."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while _alive(pid):
        time.sleep(0.1)


def _tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "  (no log)"
    return "\n".join(f"    | {line}" for line in text)

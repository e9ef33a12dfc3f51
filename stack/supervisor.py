"""Start, health-check, report and stop the processes of one stack, by PID.

State lives in ``<state_dir>/stack.json``. A process counts as ours only if it is alive
and its environment carries ``INFERSIGHT_STACK=<state_dir>``, so ``down`` never signals a
process that merely reused a PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from infersight.stack.components import Component, StackLayout
from infersight.stack.errors import StackError
from infersight.stack.kafka_admin import ensure_topics
from infersight.stack.ports import PortPlan, port_in_use

STATE_FILE = "stack.json"
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
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, pids: dict[str, int]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = {"ports": self.layout.ports.to_dict(), "pids": pids}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

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

    def up(self, timeout: float = START_TIMEOUT_S, only: Collection[str] | None = None) -> float:
        """Start whatever is not running (of ``only``, if given), wait until healthy; returns seconds taken."""
        started_at = time.monotonic()
        components = [c for c in self.layout.components() if only is None or c.name in only]
        running = self.running_components()
        pids = dict(running)
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        to_start = [c for c in components if c.name not in running]
        for c in components:
            if c.name in running:
                self.log(f"  {c.name:<26} already running (pid {running[c.name]})")
        self._check_ports_free(to_start)
        for c in to_start:
            pids[c.name] = self._spawn(c)
            self._save(pids)
        topics_ready = False
        for c in components:
            self._wait_healthy(c, pids[c.name], started_at + timeout)
            if c.name == "kafka" and not topics_ready:
                created = ensure_topics(self.layout.kafka_bootstrap)
                if created:
                    self.log(f"  {'kafka topics':<26} created {', '.join(created)}")
                topics_ready = True
        return time.monotonic() - started_at

    def _check_ports_free(self, components: list[Component]) -> None:
        for c in components:
            for what, port in c.ports.items():
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
        out = []
        for c in self.layout.components():
            pid = pids.get(c.name)
            running = pid is not None and self.is_ours(pid)
            out.append(ComponentStatus(c.name, pid if running else None, running,
                                       running and c.healthy(), c.ports, c.log))
        return out

    def stop(self, name: str, grace_s: float = 20.0) -> bool:
        """Stop one component (an outage, a restart); ``up()`` starts it again. False if not running."""
        pids = self._pids()
        pid = pids.pop(name, None)
        if pid is None or not self.is_ours(pid):
            return False
        _terminate(pid, grace_s)
        self._save(pids)
        self.log(f"  {name:<26} stopped (pid {pid})")
        return True

    def down(self, wipe: bool = False, grace_s: float = 20.0) -> list[str]:
        """Stop the processes this stack started (newest first); returns the names stopped."""
        stopped = [c.name for c in reversed(self.layout.components()) if self.stop(c.name, grace_s)]
        if self.state_dir.exists():
            self._save({})  # also forgets pids of processes that are gone or no longer ours
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

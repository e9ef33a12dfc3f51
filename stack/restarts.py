"""The supervisor's restart policy and bookkeeping, as pure data: no processes, no clock of its own.

A component that dies (any exit: a crash, ``kill -9``, a clean exit nobody asked for) is started again
after a back-off that doubles with each death in a row, as systemd's ``Restart=always`` with
``RestartSteps``/``RestartMaxDelaySec`` or Kubernetes' CrashLoopBackOff do:

- the first restart waits ``initial_s`` (1 s), the next 2 s, 4 s, ... up to ``max_s`` (30 s);
- a component that then stays up ``reset_after_s`` (60 s) has its streak forgotten: its next death waits
  ``initial_s`` again (Kubernetes resets after 10 minutes of running; a local stack restarts faster);
- it never gives up (a component that cannot start keeps being tried every ``max_s``; ``status`` shows
  the count and the last exit, the component's log says why).

``RestartBook.step`` is called for each supervised component on every poll with what the watcher saw
(its recorded PID, whether that process is alive, the time) and answers whether to start it now;
``started`` records the new process. The book round-trips through JSON (``<state>/supervisor.json``),
which is what ``infersight status`` reads.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def delay(self, deaths_in_row: int) -> float:
        """Seconds to wait before restarting after the ``deaths_in_row``-th death in a row (1 = the first)."""
        if deaths_in_row < 1:
            raise ValueError(f"deaths_in_row counts from 1, got {deaths_in_row}")
        return min(self.max_s, self.initial_s * self.factor ** (deaths_in_row - 1))


@dataclass
class RestartRecord:
    """What the supervisor knows of one component."""

    restarts: int = 0                 # processes the supervisor started for it, in this stack's life
    deaths_in_row: int = 0            # deaths since it last stayed up reset_after_s
    pid: int | None = None            # the process last seen (or started) for it
    up_since: float | None = None     # when that process was first seen alive
    restart_at: float | None = None   # when a pending restart is due (None: none pending)
    last_exit: str | None = None      # how the last process ended, as far as the watcher could tell
    last_exit_at: float | None = None

    @property
    def waiting(self) -> bool:
        return self.restart_at is not None


@dataclass
class RestartBook:
    policy: Backoff = field(default_factory=Backoff)
    records: dict[str, RestartRecord] = field(default_factory=dict)

    def record(self, name: str) -> RestartRecord:
        return self.records.setdefault(name, RestartRecord())

    def step(self, name: str, pid: int | None, alive: bool, now: float, exit_how: str | None = None) -> bool:
        """One observation of ``name``: its recorded ``pid`` is ``alive`` or not at ``now``. Returns True when the
        component must be started now (it is dead and its back-off has run out)."""
        r = self.record(name)
        if alive:
            if pid != r.pid or r.up_since is None:  # a new process (ours, or one `up` started): adopt it
                r.pid, r.up_since = pid, now
            r.restart_at = None
            if r.deaths_in_row and now - r.up_since >= self.policy.reset_after_s:
                r.deaths_in_row = 0
            return False
        if r.restart_at is None:  # just found dead: schedule the restart
            r.deaths_in_row += 1
            r.restart_at = now + self.policy.delay(r.deaths_in_row)
            r.last_exit, r.last_exit_at = exit_how or "exited", now
            r.up_since = None
        return now >= r.restart_at

    def started(self, name: str, pid: int, now: float) -> None:
        """The supervisor started a new process for ``name``."""
        r = self.record(name)
        r.restarts += 1
        r.pid, r.up_since, r.restart_at = pid, now, None

    def start_failed(self, name: str, now: float, why: str) -> None:
        """Starting ``name`` failed before a process ran (its preparation failed): back off further."""
        r = self.record(name)
        r.deaths_in_row += 1
        r.restart_at = now + self.policy.delay(r.deaths_in_row)
        r.last_exit, r.last_exit_at = f"start failed: {why}", now

    def forget(self, name: str) -> None:
        """``name`` was stopped on purpose (``Stack.stop``): no restart pending; its count stays."""
        r = self.record(name)
        r.restart_at, r.pid, r.up_since = None, None, None

    def to_json(self) -> dict:
        return {"policy": asdict(self.policy), "components": {n: asdict(r) for n, r in self.records.items()}}

    @classmethod
    def from_json(cls, data: dict) -> RestartBook:
        policy = Backoff(**data.get("policy", {}))
        return cls(policy, {n: RestartRecord(**r) for n, r in (data.get("components") or {}).items()})


def describe_exit(status: int | None) -> str:
    """``os.waitpid``'s status as words: "killed by SIGKILL", "exit code 1"; None (a process the supervisor did
    not start, whose status it cannot read): "exited (status unknown)"."""
    import os

    if status is None:
        return "exited (status unknown)"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return "exited"

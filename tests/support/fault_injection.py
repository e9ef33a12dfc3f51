"""Faults done to a running stack, shared by the multi-region tests and ``bench/region_faults.py``: a flapping
region link, a component out of service for a while, a component killed with ``kill -9`` that the stack's
supervisor brings back. Each returns the monotonic instants a caller's ledger and status figures start from."""

from __future__ import annotations

import os
import signal
import time


def flap_link(layout, region: str, every_s: float, for_s: float) -> int:
    """Cut ``region``'s link, heal it ``every_s`` later, and so on for ``for_s`` (on a fixed schedule, so slow
    control calls do not stretch it); it ends healed. Returns how many times it was cut."""
    from infersight.stack.multiregion import link

    started = time.monotonic()
    cuts, k = 0, 0
    while (due := started + k * every_s) < started + for_s:
        time.sleep(max(0.0, due - time.monotonic()))
        if k % 2 == 0:
            link(layout, region, "cut")
            cuts += 1
        else:
            link(layout, region, "heal")
        k += 1
    time.sleep(max(0.0, started + for_s - time.monotonic()))
    link(layout, region, "heal")
    return cuts


def outage(stack, name: str, hold_s: float, grace_s: float = 20.0) -> tuple[float, float]:
    """``name`` stopped for ``hold_s`` (out of the supervisor's care: ``Stack.stop`` forgets it first; ``grace_s``
    0 is a ``kill -9``), then started again. Returns (stopped, healthy again), monotonic."""
    stopped_at = time.monotonic()
    if not stack.stop(name, grace_s=grace_s):
        raise RuntimeError(f"{name} was not running")
    time.sleep(max(0.0, stopped_at + hold_s - time.monotonic()))
    stack.up(only=[name])
    return stopped_at, time.monotonic()


def kill9(stack, name: str, timeout_s: float = 180.0) -> tuple[float, float | None]:
    """``kill -9`` of ``name``; the supervisor starts it again. Returns (killed, a new process of it healthy;
    None if not within ``timeout_s``), monotonic."""
    component = next(c for c in stack.layout.components() if c.name == name)
    pid = stack.running_components()[name]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while time.monotonic() - killed_at < timeout_s:
        if stack.running_components().get(name) not in (None, pid) and component.healthy():
            return killed_at, time.monotonic()
        time.sleep(0.5)
    return killed_at, None

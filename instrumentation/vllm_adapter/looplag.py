"""Event-loop lag of the API server process: what no per-request timer sees.

Every handler, stream and the engine's output loop of vLLM's OpenAI server share one asyncio loop; while
it runs other callbacks, a request that has arrived on the socket waits before the app is even called, and
a token that is ready waits before its bytes are written. A task sleeping ``interval_s`` measures how late
it is woken; each lag goes into the ``infersight.server.event_loop.lag`` histogram and the largest since the
previous collection is the ``...lag.max`` gauge. Hand-written: asyncio offers no lag metric (aiomonitor and
the like are debugging consoles, not meters).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from infersight.instrumentation.meters import histogram
from infersight.schemas import metrics as M
from infersight.schemas.registry import get

_log = logging.getLogger(__name__)
INTERVAL_S = 0.02


class LoopLag:
    """Samples the running loop's lag every ``interval_s`` once ``ensure_started`` ran on that loop."""

    def __init__(self, meter: Any, interval_s: float = INTERVAL_S) -> None:
        entry = get(M.EVENT_LOOP_LAG)
        self._hist = histogram(meter, M.EVENT_LOOP_LAG, entry.unit, entry.description, entry.buckets)
        meter.create_observable_gauge(M.EVENT_LOOP_LAG_MAX, callbacks=[self._observe_max], unit="s",
                                      description=get(M.EVENT_LOOP_LAG_MAX).description)
        self.interval_s = interval_s
        self._max = 0.0
        self._task: asyncio.Task | None = None
        self.samples = 0

    def ensure_started(self) -> None:
        task = self._task
        if task is not None and not task.done():
            return
        try:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="infersight-loop-lag")
        except RuntimeError:  # no running loop: nothing to measure
            self._task = None

    async def _run(self) -> None:
        interval, record, perf = self.interval_s, self._hist.record, time.perf_counter
        while True:
            t0 = perf()
            await asyncio.sleep(interval)
            lag = max(0.0, perf() - t0 - interval)
            record(lag)
            self.samples += 1
            if lag > self._max:
                self._max = lag

    def _observe_max(self, options: CallbackOptions) -> Iterable[Observation]:
        value, self._max = self._max, 0.0
        return [Observation(value)] if self._task is not None else []

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

"""Evaluation beside serving: a per-model sampler and a background worker with a bounded queue.

``submit`` runs on the serving path: a random draw and a ``put_nowait``; when the queue is full the sample is
dropped and counted, so serving never waits. The worker thread runs the evaluators and records each result on
the request (``RequestContext.evaluation``: a ``gen_ai.evaluation.result`` event in the request's trace with
``infersight.evaluation.sample_rate``). Explanations may quote content: they are exported only when content
capture is on, after the redaction hook; otherwise dropped.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infersight.instrumentation.evaluation.base import Evaluator, Sample


@dataclass
class Sampler:
    """Per model sample rate (``default`` for the others); the rate is returned so it is recorded with the
    result (the quality job weights by its inverse)."""

    default: float = 0.01
    rates: Mapping[str, float] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        for model, rate in {"(default)": self.default, **self.rates}.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"sample rate of {model} must be in [0, 1], got {rate!r}")

    def rate(self, model: str) -> float:
        return self.rates.get(model, self.default)

    def draw(self, model: str) -> float | None:
        """The rate if this request is sampled, else None."""
        r = self.rate(model)
        return r if r > 0 and self.rng.random() < r else None


@dataclass
class Counters:
    submitted: int = 0
    sampled: int = 0
    dropped_queue_full: int = 0
    evaluated: int = 0
    evaluator_errors: int = 0
    results: int = 0


class EvaluationWorker:
    """``submit(request, sample)`` from the serving path; ``close()`` at shutdown."""

    def __init__(self, evaluators: Sequence[Evaluator], sampler: Sampler | None = None, max_queue: int = 1000,
                 capture_content: bool = False, redact: Callable[[str], str] | None = None) -> None:
        self.evaluators, self.sampler = list(evaluators), sampler or Sampler()
        self.capture_content, self.redact = capture_content, redact
        self.counters = Counters()
        self._queue: queue.Queue[tuple[Any, Sample, float] | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="infersight-evaluation", daemon=True)
        self._thread.start()

    def submit(self, request: Any, sample: Sample) -> bool:
        """Sample and enqueue; never blocks. True when queued."""
        self.counters.submitted += 1
        rate = self.sampler.draw(sample.model)
        if rate is None:
            return False
        self.counters.sampled += 1
        try:
            self._queue.put_nowait((request, sample, rate))
        except queue.Full:
            self.counters.dropped_queue_full += 1
            return False
        return True

    def _explanation(self, text: str | None) -> str | None:
        if text is None or not self.capture_content:
            return None
        try:
            out = self.redact(text) if self.redact is not None else text
        except Exception:  # noqa: BLE001 - drop the text rather than export it unredacted
            return None
        return out if isinstance(out, str) else None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, sample, rate = item
            for ev in self.evaluators:
                try:
                    results = ev.evaluate(sample)
                except Exception:  # noqa: BLE001 - a failing evaluator is counted; the others still run
                    self.counters.evaluator_errors += 1
                    continue
                for r in results:
                    request.evaluation(r.name, score_value=r.score, score_label=r.label, sample_rate=rate,
                                       explanation=self._explanation(r.explanation))
                    self.counters.results += 1
            self.counters.evaluated += 1
            self._queue.task_done()

    def join(self) -> None:
        """Wait until everything queued has been evaluated (tests, shutdown)."""
        self._queue.join()

    def close(self, timeout_s: float = 5.0) -> None:
        self.join()
        self._queue.put(None)
        self._thread.join(timeout_s)

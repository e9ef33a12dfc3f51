"""The generation engine: one worker thread runs requests in arrival order (so waiting requests really
queue), one compiled forward pass per token, every stage reported through the generic request API."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from infersight.instrumentation import Instrumentation, RequestContext
from infersight.instrumentation.reference_server.model import EOS, TinyLM, build_model, decode, encode
from infersight.instrumentation.torch_compile import InstrumentedModule, instrument_module

Emit = Callable[[dict], None]


@dataclass
class Job:
    req: RequestContext
    prompt: str
    max_tokens: int
    temperature: float
    seed: int | None
    emit: Emit                       # called from the worker thread with {"token": str} / {"finish": ...}
    queue_stage: Any = None
    cancelled: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, inst: Instrumentation, *, backend: str = "aot_eager", seed: int = 0, context: int = 64,
                 model_name: str = "infersight-tiny", warmup: bool = True, tracer_provider: Any = None,
                 meter_provider: Any = None) -> None:
        self.inst, self.model_name = inst, model_name
        self.model: TinyLM = build_model(seed, context)
        self.context = context
        compiled = torch.compile(self.model, backend=backend, dynamic=False) if backend != "none" else self.model
        self.forward: InstrumentedModule = instrument_module(compiled, model_name, tracer_provider=tracer_provider,
                                                            meter_provider=meter_provider)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="reference-engine", daemon=True)
        self._thread.start()
        if warmup:  # compile now, not inside the first request
            self._step(torch.zeros(1, context, dtype=torch.long), 0)

    def submit(self, job: Job) -> None:
        job.queue_stage = job.req.stage("queue")
        with self._lock:
            self._waiting += 1
            self.inst.gauges.queue_depth = self._waiting
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    @torch.inference_mode()
    def _step(self, window: torch.Tensor, last: int) -> torch.Tensor:
        return self.forward(window, torch.tensor([last]))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self.inst.gauges.queue_depth = self._waiting
                self.inst.gauges.running = 1
            try:
                self._generate(job)
            except Exception as exc:  # noqa: BLE001 - report and keep serving
                job.req.error(exc)
                job.req.finish("error")
                job.emit({"finish": "error", "error": type(exc).__name__})
            finally:
                self.inst.gauges.running = 0

    def _sample(self, logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
        if temperature <= 0:
            return int(logits.argmax(-1))
        probs = torch.softmax(logits[0] / temperature, -1)
        return int(torch.multinomial(probs, 1, generator=gen))

    def _generate(self, job: Job) -> None:
        req = job.req
        job.queue_stage.end()
        prompt = encode(job.prompt)[-(self.context // 2):] or [EOS]
        budget = max(0, min(job.max_tokens, self.context - len(prompt)))
        window = torch.zeros(1, self.context, dtype=torch.long)
        window[0, : len(prompt)] = torch.tensor(prompt)
        gen = torch.Generator().manual_seed(job.seed if job.seed is not None else time.time_ns() % 2**31)
        out: list[int] = []
        reason = "length"
        if budget == 0:
            req.usage(input_tokens=len(prompt), output_tokens=0)
            req.finish("length")
            job.emit({"finish": "length", "prompt_tokens": len(prompt), "completion_tokens": 0})
            return
        with req.stage("prefill"):
            logits = self._step(window, len(prompt) - 1)
        token = self._sample(logits, job.temperature, gen)
        with req.stage("decode"):
            while True:
                if token == EOS:
                    reason = "stop"
                    break
                if out:
                    req.token()
                else:
                    req.first_token()
                out.append(token)
                job.emit({"token": decode([token])})
                if len(out) >= budget:
                    break
                if job.cancelled.is_set():
                    reason = "abort"
                    break
                pos = len(prompt) + len(out) - 1
                window[0, pos] = token
                token = self._sample(self._step(window, pos), job.temperature, gen)
        req.usage(input_tokens=len(prompt), output_tokens=len(out))
        req.prompt(job.prompt)          # recorded only when content capture is on, after redaction
        req.completion(decode(out))
        req.finish(reason)
        job.emit({"finish": reason, "prompt_tokens": len(prompt), "completion_tokens": len(out)})

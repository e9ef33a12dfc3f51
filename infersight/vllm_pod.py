"""One real pod in the demo: the tiny vLLM engine (OpenAI-compatible server, our stat-logger plugin loaded
through vLLM's entry point) serving a steady trickle of streaming chat requests, its telemetry sent
to a regional gateway like any pod's."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import requests

PROMPTS = ("the quick brown fox", "tell me about the weather", "a long story about a small model",
           "explain streaming telemetry", "why is the canary slow")


class VllmPod:
    def __init__(self, scratch: Path, otlp_endpoint: str, region: str, concurrency: int = 2,
                 max_tokens: int = 32) -> None:
        self.scratch, self.otlp_endpoint, self.region = scratch, otlp_endpoint, region
        self.concurrency, self.max_tokens = concurrency, max_tokens
        self.server = None
        self.served = 0
        self.failed = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> VllmPod:
        from infersight.instrumentation.vllm_adapter.engine import OpenAIServer, engine_env
        from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model

        env = engine_env(self.scratch, otlp_endpoint=self.otlp_endpoint, region=self.region,
                         service_name="vllm-tiny-demo",
                         extra={"OTEL_RESOURCE_ATTRIBUTES": f"k8s.pod.name=vllm-tiny-0.{self.region}"})
        self.server = OpenAIServer(build_tiny_model(), env=env, log_path=self.scratch / "vllm-server.log",
                                   max_num_seqs=4).start()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._drive, args=(i,), daemon=True, name=f"vllm-client-{i}")
            t.start()
            self._threads.append(t)
        return self

    def _drive(self, i: int) -> None:
        prompts = itertools.cycle(PROMPTS[i:] + PROMPTS[:i])
        while not self._stop.is_set():
            body = {"model": self.server.model, "messages": [{"role": "user", "content": next(prompts)}],
                    "max_tokens": self.max_tokens, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}
            try:
                with requests.post(self.server.url + "/v1/chat/completions", json=body, stream=True,
                                   timeout=120) as resp:
                    resp.raise_for_status()
                    for _ in resp.iter_lines():
                        pass
                self.served += 1
            except requests.RequestException:
                self.failed += 1
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=130)
        if self.server is not None:
            self.server.stop()

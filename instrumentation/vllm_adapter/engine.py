"""Start a real vLLM engine on a CPU-only machine: in-process ``AsyncLLM`` or the OpenAI-compatible
server as a subprocess, on loopback, offline, with the settings that work here (see NOTES "vLLM on CPU").

    model = build_tiny_model()
    env = engine_env(scratch_dir, otlp_endpoint="http://127.0.0.1:4317")
    with OpenAIServer(model, env=env) as server:
        requests.post(server.url + "/v1/completions", json={...})

Scripts that start AsyncLLM need the ``if __name__ == "__main__":`` guard (vLLM spawns its engine core).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_KV_CACHE_BYTES = 8 * 1024 * 1024
MAX_MODEL_LEN = 512
BLOCK_SIZE = 32  # vLLM on CPU defaults to 128-token blocks: too coarse for prefix caching on short prompts


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def engine_env(scratch_dir: str | Path, *, otlp_endpoint: str | None = None, region: str | None = None,
               service_name: str = "vllm-tiny", plugin: bool = True,
               extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a vLLM process: offline, no usage stats, loopback, scratch cache; our telemetry to
    ``otlp_endpoint`` through the standard ``OTEL_*`` variables; ``plugin=False`` keeps the infersight
    entry point from loading (``VLLM_PLUGINS`` names no plugin)."""
    scratch = Path(scratch_dir)
    scratch.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "HF_HOME": str(scratch / "hf-home"),
        "TOKENIZERS_PARALLELISM": "false",
        "OTEL_SERVICE_NAME": service_name,
        "OTEL_BSP_SCHEDULE_DELAY": "500",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
    }
    if otlp_endpoint:
        # per-signal too: they win over the general one, and vLLM's init_tracer writes the traces one
        for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
            env[var] = otlp_endpoint
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
    if region:
        env["INFERSIGHT_REGION"] = region
    if not plugin:
        env["VLLM_PLUGINS"] = "none"
    if extra:
        env.update(extra)
    return env


def apply_env(env: Mapping[str, str]) -> None:
    """Put ``env`` into this process's environment (before vLLM is imported or an engine starts)."""
    os.environ.update(env)


def async_engine_args(model_dir: str | Path, *, max_num_seqs: int = 8,
                      kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES, enable_prefix_caching: bool = True,
                      otlp_traces_endpoint: str | None = None, max_num_batched_tokens: int | None = None,
                      block_size: int = BLOCK_SIZE,
                      **overrides: Any):
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = dict(
        model=str(model_dir), tokenizer=str(model_dir), dtype="float32", enforce_eager=True,
        max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs, kv_cache_memory_bytes=kv_cache_memory_bytes,
        enable_prefix_caching=enable_prefix_caching, otlp_traces_endpoint=otlp_traces_endpoint,
        disable_log_stats=False, enable_log_requests=False, seed=0, block_size=block_size)
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    kwargs.update(overrides)
    return AsyncEngineArgs(**kwargs)


def start_async_llm(model_dir: str | Path, *, stat_loggers: Sequence[Any] | None = None, **engine_kwargs: Any):
    """An ``AsyncLLM`` on the model (25-40 s on 2 cores). Call ``.shutdown()`` when done."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(async_engine_args(model_dir, **engine_kwargs),
                                     stat_loggers=list(stat_loggers) if stat_loggers else None)


class OpenAIServer:
    """``python -m vllm.entrypoints.openai.api_server`` on loopback and a free port; a context manager."""

    def __init__(self, model_dir: str | Path, *, env: Mapping[str, str], port: int | None = None,
                 max_num_seqs: int = 8, kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES,
                 served_model_name: str | None = None, extra_args: Sequence[str] = (),
                 log_path: str | Path | None = None, startup_timeout_s: float = 240.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = served_model_name or Path(model_dir).name
        self.args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                     "--served-model-name", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                     "--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
                     "--max-num-seqs", str(max_num_seqs), "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
                     "--enable-prefix-caching", "--block-size", str(BLOCK_SIZE), "--seed", "0", *extra_args]
        self.env = {**os.environ, **env}
        default_log = Path(env.get("VLLM_CACHE_ROOT", ".")) / f"server-{self.port}.log"
        self.log_path = Path(log_path) if log_path else default_log
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> OpenAIServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed in stop()
        self._log = log
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode} during start-up; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not healthy after {self.startup_timeout_s} s; log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)  # the server and its engine-core child: its own session
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # anything of its group left behind (the engine core) goes too
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

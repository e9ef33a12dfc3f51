"""The vLLM adapter: a stat-logger plugin (``InfersightStatLogger``, entry point ``infersight`` in the
``vllm.stat_logger_plugins`` group), a tiny-model builder and engine helpers for tests, benchmarks and
the demo. vLLM is imported only when the plugin or the engine helpers are used."""

from __future__ import annotations

from typing import Any

from infersight.instrumentation.vllm_adapter.tiny_model import TinyModelSpec, build_tiny_model

__all__ = ["InfersightStatLogger", "TinyModelSpec", "build_tiny_model"]


def __getattr__(name: str) -> Any:
    if name == "InfersightStatLogger":
        from infersight.instrumentation.vllm_adapter.plugin import InfersightStatLogger

        return InfersightStatLogger
    raise AttributeError(name)

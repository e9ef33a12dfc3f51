"""GPU gauges from NVML (nvidia-ml-py, imported lazily): utilisation, memory used/total, memory
bandwidth utilisation, one series per device (``hw.id``). No NVML or no GPU: one log line, nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from infersight.schemas import metrics as M
from infersight.schemas.attributes import HW_ID
from infersight.schemas.registry import get

_log = logging.getLogger("infersight.instrumentation")


def register_gpu_gauges(meter: Meter, nvml=None) -> bool:
    """Register the GPU gauges; returns False (after one log line) when NVML or a GPU is absent."""
    try:
        if nvml is None:
            import pynvml as nvml  # provided by nvidia-ml-py
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, driver missing: all mean "no GPU"
        _log.info("infersight: no GPU metrics (NVML unavailable: %s)", exc)
        return False
    if not handles:
        _log.info("infersight: no GPU metrics (NVML found no device)")
        return False
    attrs = [{HW_ID: str(i)} for i in range(len(handles))]

    def gauge(name: str, read: Callable[[object], float]) -> None:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for handle, attr in zip(handles, attrs, strict=True):
                try:
                    out.append(Observation(read(handle), attr))
                except Exception:  # noqa: BLE001 - a device that stops answering is skipped, not fatal
                    continue
            return out

        entry = get(name)
        meter.create_observable_gauge(name, callbacks=[observe], unit=entry.unit, description=entry.description)

    gauge(M.HW_GPU_UTILIZATION, lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
    gauge(M.HW_GPU_MEMORY_UTILIZATION, lambda h: nvml.nvmlDeviceGetUtilizationRates(h).memory / 100.0)
    gauge(M.HW_GPU_MEMORY_USAGE, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used)
    gauge(M.HW_GPU_MEMORY_LIMIT, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total)
    return True

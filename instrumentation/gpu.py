"""GPU gauges from NVML (``pynvml``, from nvidia-ml-py: part of the base install, pure Python; it loads the
driver's ``libnvidia-ml.so.1`` at ``nvmlInit``): utilisation, memory used/total, memory bandwidth
utilisation, one series per device (``hw.id``).

No NVML and no GPU device (a CPU pod): one INFO line, nothing else. A GPU device node present (``/dev/nvidia0``
...) but NVML not loadable or seeing no device: one WARNING naming the cause and the fix, since GPU gauges
were expected there.
"""

from __future__ import annotations

import glob
import logging
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from infersight.schemas import metrics as M
from infersight.schemas.attributes import HW_ID
from infersight.schemas.registry import get

_log = logging.getLogger("infersight.instrumentation")

# NVML's error classes (pynvml names them NVMLError_<Name>) -> (cause, fix)
_CONTAINER_FIX = ("run the container with the NVIDIA Container Toolkit and the driver's utility libraries "
                  "(NVIDIA_DRIVER_CAPABILITIES=compute,utility or all; on Kubernetes the NVIDIA device plugin or "
                  "GPU operator sets this), so libnvidia-ml.so.1 is mounted")
_CAUSES = {
    "NVMLError_LibraryNotFound": ("the driver's NVML library (libnvidia-ml.so.1) is not in this container or on "
                                  "the library path", _CONTAINER_FIX),
    "NVMLError_DriverNotLoaded": ("the NVIDIA kernel driver is not loaded", "check `nvidia-smi` on the node"),
    "NVMLError_LibRmVersionMismatch": ("the NVML library and the kernel driver are different versions",
                                       "use the node's driver libraries (NVIDIA Container Toolkit), or reboot the "
                                       "node after a driver upgrade"),
    "NVMLError_NoPermission": ("this process may not open the GPU devices",
                               "give the container access to /dev/nvidia* (device plugin, or --gpus)"),
    "NVMLError_InsufficientPermissions": ("this process may not open the GPU devices",
                                          "give the container access to /dev/nvidia* (device plugin, or --gpus)"),
}


def gpu_device() -> str | None:
    """The first NVIDIA GPU device node of this machine or container (``/dev/nvidia0`` ...), or None."""
    nodes = sorted(p for p in glob.glob("/dev/nvidia[0-9]*") if p[len("/dev/nvidia"):].isdigit())
    return nodes[0] if nodes else None


def _cause_and_fix(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, ImportError):
        return ("pynvml is not importable (nvidia-ml-py missing)",
                "pip install nvidia-ml-py (infersight's base install brings it: reinstall infersight)")
    known = _CAUSES.get(type(exc).__name__)
    if known:
        return known
    if isinstance(exc, OSError) or "libnvidia-ml" in str(exc):
        return _CAUSES["NVMLError_LibraryNotFound"]
    return f"NVML failed: {exc!r}", "check that `nvidia-smi` works in this container; " + _CONTAINER_FIX


def register_gpu_gauges(meter: Meter, nvml=None, find_device: Callable[[], str | None] = gpu_device) -> bool:
    """Register the GPU gauges; returns False (after one log line) when NVML or a GPU is absent: INFO on a
    machine without a GPU device, WARNING (cause and fix) where ``find_device`` sees one."""
    try:
        if nvml is None:
            import pynvml as nvml  # provided by nvidia-ml-py
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, driver missing
        device = _device(find_device)
        if device is None:
            _log.info("infersight: no GPU metrics (no GPU device; NVML unavailable: %s)", exc)
        else:
            cause, fix = _cause_and_fix(exc)
            _log.warning("infersight: no GPU metrics although %s is present: %s (%s). Fix: %s.", device, cause,
                         exc, fix)
        return False
    if not handles:
        device = _device(find_device)
        if device is None:
            _log.info("infersight: no GPU metrics (NVML found no device)")
        else:
            _log.warning("infersight: no GPU metrics although %s is present: NVML sees no device. Fix: check "
                         "NVIDIA_VISIBLE_DEVICES / CUDA device assignment of this container.", device)
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


def _device(find_device: Callable[[], str | None]) -> str | None:
    try:
        return find_device()
    except Exception:  # noqa: BLE001 - looking for a device must not fail the server
        return None

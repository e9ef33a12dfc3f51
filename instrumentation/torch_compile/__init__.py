"""torch.compile adapter: compile/recompile events with durations, reasons and graph breaks (from torch's
own compile records), and per-call latency of a compiled module. See docs/torch_compile.md."""

from infersight.instrumentation.torch_compile.instrumentor import TorchCompileInstrumentor
from infersight.instrumentation.torch_compile.module import InstrumentedModule, instrument_module
from infersight.instrumentation.torch_compile.watcher import CompileEvent, CompileWatcher, event_from_metrics

__all__ = ["CompileEvent", "CompileWatcher", "InstrumentedModule", "TorchCompileInstrumentor",
           "event_from_metrics", "instrument_module"]

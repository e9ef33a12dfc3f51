"""Telemetry names of the torch.compile adapter, as registry entries.

They are ``infersight.*`` names (no semantic convention covers compilation); :data:`ENTRIES` is part
of ``schemas.registry`` and so of the generated reference page.
"""

from __future__ import annotations

from infersight.schemas.spec import Entry, Instrument, Kind, Source

# span attributes (on "torch.compile {frame}" spans)
COMPILE_ID = "infersight.torch_compile.compile_id"
FRAME = "infersight.torch_compile.frame"
COMPILE_KIND = "infersight.torch_compile.kind"            # compile | recompile (also a metric dimension)
RECOMPILE_REASON = "infersight.torch_compile.recompile_reason"
GRAPH_BREAKS = "infersight.torch_compile.graph_breaks"
GRAPH_BREAK_REASONS = "infersight.torch_compile.graph_break_reasons"
GRAPH_OPS = "infersight.torch_compile.graph_ops"
MODULE = "infersight.torch_compile.module"                 # name given to instrument_module (metric dimension)
COMPILED_DURING_CALL = "infersight.torch_compile.compiled_during_call"  # metric dimension, 2 values
# metrics
COMPILE_DURATION = "infersight.torch_compile.duration"
COMPILES = "infersight.torch_compile.compiles"
GRAPH_BREAK_COUNT = "infersight.torch_compile.graph_breaks.count"
CALL_DURATION = "infersight.torch_compile.call.duration"
GRAPH_BREAK_REASON = "infersight.torch_compile.graph_break.reason"  # dimension of the graph-break counter

COMPILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CALL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0)

_US = Source.INFERSIGHT
_KINDS = "infersight.torch_compile.kind (compile, recompile), error.type"


def _span(name: str, typ: str, desc: str, unit: str = "", dim: bool = False, card: str = "per compile") -> Entry:
    return Entry(name, Kind.SPAN, typ, _US, desc, unit=unit, cardinality=card, metric_dimension=dim)


ENTRIES: tuple[Entry, ...] = (
    _span(COMPILE_ID, "string", "Dynamo's compile id, frame/attempt (e.g. 0/1: frame 0, its 2nd compile)."),
    _span(FRAME, "string", "Python function (code object name) Dynamo compiled."),
    _span(COMPILE_KIND, "string", "compile (first for a frame) or recompile (guards failed).", dim=True,
          card="2 values"),
    _span(RECOMPILE_REASON, "string", "First failed guard that caused the recompile (Dynamo's own text)."),
    _span(GRAPH_BREAKS, "int", "Graph breaks recorded by Dynamo during this compile.", "{break}"),
    _span(GRAPH_BREAK_REASONS, "string[]", "First line of each graph-break reason in this compile."),
    _span(GRAPH_OPS, "int", "Operators in the captured graph.", "{op}"),
    _span(MODULE, "string", "Name given to an instrumented compiled module.", dim=True,
          card="low: compiled modules of the server"),
    _span(COMPILED_DURING_CALL, "boolean", "Whether this call triggered a (re)compile (latency outlier).",
          dim=True, card="2 values"),
    _span(GRAPH_BREAK_REASON, "string", "Graph-break category (first line of Dynamo's reason).", dim=True,
          card="low: Dynamo's fixed set of graph-break types"),
    Entry(COMPILE_DURATION, Kind.METRIC, "double", _US, "Duration of one Dynamo compile (frame), every compile.",
          unit="s", cardinality=_KINDS, instrument=Instrument.HISTOGRAM, buckets=COMPILE_BUCKETS,
          buckets_why="compiles take 10 ms (eager) to minutes (inductor, max-autotune)"),
    Entry(COMPILES, Kind.METRIC, "int", _US, "Compiles and recompiles.", unit="{compile}", cardinality=_KINDS,
          instrument=Instrument.COUNTER),
    Entry(GRAPH_BREAK_COUNT, Kind.METRIC, "int", _US, "Graph breaks, by reason category.", unit="{break}",
          cardinality=GRAPH_BREAK_REASON, instrument=Instrument.COUNTER),
    Entry(CALL_DURATION, Kind.METRIC, "double", _US, "Latency of one call of an instrumented compiled module.",
          unit="s", cardinality=f"{MODULE}, {COMPILED_DURING_CALL}, error.type", instrument=Instrument.HISTOGRAM,
          buckets=CALL_BUCKETS, buckets_why="a decode step is 0.1-50 ms; calls that compile take seconds"),
)

"""The client-call record (issue #22): the two halves of one request seen from both ends, which the metrics
job joins by trace to publish the client's time to first token per region and model.

normalize writes them, as JSON arrays, on ``infersight.client_calls``:

- a **client** half per span carrying ``infersight.client.ttft`` (the CLIENT span of
  ``instrumentation.openai_client``: the caller's own measurement);
- a **server** half per request record whose span has a parent (only a request called with a
  ``traceparent`` can have a client span in its trace; a root request span, the simulator's for one, makes none).

| field | type | meaning |
|---|---|---|
| ``side`` | ``"client"`` or ``"server"`` | which half |
| ``trace_id`` | 32 hex | the trace: the join key |
| ``span_id`` | 16 hex | the CLIENT span's id, or the request span's id |
| ``parent_span_id`` | 16 hex or ``""`` | the span's parent (a server half's: the client span, when called directly) |
| ``model`` | string | client: ``gen_ai.request.model`` (else the response's); server: the record's |
| ``region`` | string or null | server: the record's region; client: its gateway's (never published) |
| ``start_ns``, ``end_ns`` | int | the span's times (ns since the epoch) |
| ``ttft_s`` | float or null | client: its TTFT (required); server: the record's (the edge TTFT with the vLLM plugin) |
"""

from __future__ import annotations

import math
import re
from typing import Any

CLIENT, SERVER = "client", "server"
SIDES = (CLIENT, SERVER)
FIELDS = ("side", "trace_id", "span_id", "parent_span_id", "model", "region", "start_ns", "end_ns", "ttft_s")
MAX_MODEL_CHARS = 256  # a metric label downstream, as the request record's model
SLACK_S = 1e-6  # float rounding between a TTFT and its span's duration
_HEX32 = re.compile("[0-9a-f]{32}").fullmatch
_HEX16 = re.compile("[0-9a-f]{16}").fullmatch
_INT64_MAX = 2**63 - 1


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def problems(item: Any) -> list[str]:
    """Every contract violation of one client-call record (empty when valid), each starting with its field.
    Never raises: an item that is not an object is one problem."""
    if type(item) is not dict:
        return [f"client call: not a JSON object, got {type(item).__name__}"]
    out = []
    side = item.get("side")
    if side not in SIDES:
        out.append(f"side: {side!r:.40} is not one of {', '.join(SIDES)}")
    trace_id = item.get("trace_id")
    if not (isinstance(trace_id, str) and _HEX32(trace_id) and trace_id != "0" * 32):
        out.append(f"trace_id: {trace_id!r:.60} is not 32 lowercase hex digits (non-zero)")
    span_id = item.get("span_id")
    if not (isinstance(span_id, str) and _HEX16(span_id) and span_id != "0" * 16):
        out.append(f"span_id: {span_id!r:.40} is not 16 lowercase hex digits (non-zero)")
    parent = item.get("parent_span_id", "")
    if not (parent == "" or (isinstance(parent, str) and _HEX16(parent) and parent != "0" * 16)):
        out.append(f"parent_span_id: {parent!r:.40} is neither empty nor 16 lowercase hex digits (non-zero)")
    model = item.get("model")
    if not (isinstance(model, str) and model and len(model) <= MAX_MODEL_CHARS):
        out.append(f"model: must be a non-empty string of at most {MAX_MODEL_CHARS} characters, got {model!r:.60}")
    region = item.get("region")
    if region is not None and not (isinstance(region, str) and region):
        out.append(f"region: must be a non-empty string or null, got {region!r:.60}")
    if side == SERVER and region is None:
        out.append("region: missing on a server half (the request record's region)")
    start, end = item.get("start_ns"), item.get("end_ns")
    times_ok = True
    for name, value in (("start_ns", start), ("end_ns", end)):
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _INT64_MAX):
            out.append(f"{name}: must be a positive 64-bit integer of nanoseconds, got {value!r:.40}")
            times_ok = False
    if times_ok and end < start:
        out.append(f"end_ns: {end} is before start_ns {start}")
        times_ok = False
    ttft = item.get("ttft_s")
    if ttft is None:
        if side == CLIENT:
            out.append("ttft_s: missing on a client half")
    elif not _number(ttft) or ttft < 0:
        out.append(f"ttft_s: must be a finite non-negative number of seconds, got {ttft!r:.40}")
    elif times_ok and ttft > (end - start) / 1e9 + SLACK_S:
        out.append(f"ttft_s: {ttft} exceeds the span's duration {(end - start) / 1e9}")
    return out

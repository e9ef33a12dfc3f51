"""In-process summaries of a finished request: the ITL summary from raw marks, the root span's attributes
and the per-request record."""

from __future__ import annotations

import functools
import math
from operator import sub
from typing import TYPE_CHECKING, Any, NamedTuple

from infersight.schemas import attributes as A
from infersight.schemas.records import FINISH_REASONS, RequestRecord

if TYPE_CHECKING:
    from infersight.instrumentation.request import RequestContext

NS = 1e9


class ItlSummary(NamedTuple):
    """A tuple, not a frozen dataclass: built once per request, and frozen dataclasses construct slowly."""

    count: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float


# tuple.__new__ bound to the class: builds one without the namedtuple's Python-level __new__ (a frame less)
_new_itl = functools.partial(tuple.__new__, ItlSummary)


@functools.lru_cache(maxsize=4096)
def _ranks(n: int) -> tuple[int, int, int]:
    """Indexes of the nearest-rank p50, p90, p99 among ``n`` sorted values (observed values, never
    interpolated)."""
    return tuple(max(0, math.ceil(q * n) - 1) for q in (0.5, 0.9, 0.99))  # type: ignore[return-value]


def itl_summary(token_times_ns: list[int]) -> ItlSummary | None:
    """Summary of the gaps between consecutive token marks (sorted ascending), None with < 2 marks."""
    if len(token_times_ns) < 2:
        return None
    gaps = sorted(map(sub, token_times_ns[1:], token_times_ns))
    n = len(gaps)
    i50, i90, i99 = _ranks(n)
    return _new_itl((n, (token_times_ns[-1] - token_times_ns[0]) / n / NS, gaps[i50] / NS, gaps[i90] / NS,
                     gaps[i99] / NS, gaps[-1] / NS))


# one shared tuple per reason: a fresh one per request would keep the garbage collector tracking the
# record's attribute dict (all its other values are atomic) while the span waits in the export queue
_REASONS = {reason: (reason,) for reason in FINISH_REASONS}


def root_attributes(req: RequestContext, s: dict[str, Any]) -> dict[str, Any]:
    """The root span's attributes (also the record-only span's, so built for every request)."""
    attrs: dict[str, Any] = req._inst._base_span_attrs.copy()
    attrs[A.GEN_AI_OPERATION_NAME] = req.operation
    attrs[A.GEN_AI_REQUEST_MODEL] = req.model
    reason = req._finish_reason
    attrs[A.GEN_AI_RESPONSE_FINISH_REASONS] = _REASONS.get(reason) or (reason,)
    attrs[A.E2E] = s["e2e_s"]
    if req._response_model is not None:
        attrs[A.GEN_AI_RESPONSE_MODEL] = req._response_model
    if req._response_id is not None:
        attrs[A.GEN_AI_RESPONSE_ID] = req._response_id
    if req._error is not None:
        attrs[A.ERROR_TYPE] = req._error
    if (value := s["ttft_s"]) is not None:  # the optional figures, unrolled (every request)
        attrs[A.TTFT] = value
    if (value := s["tpot_s"]) is not None:
        attrs[A.TPOT] = value
    if (value := s["queue_s"]) is not None:
        attrs[A.QUEUE_DURATION] = value
    if (value := s["prefill_s"]) is not None:
        attrs[A.PREFILL_DURATION] = value
    if (value := s["decode_s"]) is not None:
        attrs[A.DECODE_DURATION] = value
    if (value := s["tokens_in"]) is not None:
        attrs[A.GEN_AI_USAGE_INPUT_TOKENS] = value
    attrs[A.GEN_AI_USAGE_OUTPUT_TOKENS] = s["tokens_out"]
    if req._tokens_cached:
        attrs[A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = req._tokens_cached
    itl = s["itl"]
    if itl is not None:
        (attrs[A.ITL_COUNT], attrs[A.ITL_MEAN], attrs[A.ITL_P50], attrs[A.ITL_P90], attrs[A.ITL_P99],
         attrs[A.ITL_MAX]) = itl
    if req._content:
        attrs.update(req._content)
    return attrs


def build_record(req: RequestContext) -> RequestRecord:
    """The contract's per-request record of a finished request."""
    s = req._summary
    assert s is not None
    itl: ItlSummary | None = s["itl"]
    root = req._root
    trace_id = format(root.span_context.trace_id, "032x") if root is not None else "0" * 32
    span_id = format(root.span_context.span_id, "016x") if root is not None else ""
    inst = req._inst
    return RequestRecord(
        trace_id=trace_id, span_id=span_id, region=inst.region, model=req.model, start_ns=req._wall0,
        end_ns=req._wall_ns(s["end"]), e2e_s=s["e2e_s"], model_version=inst.settings.model_version,
        track=inst.settings.track, engine=inst.engine, ttft_s=s["ttft_s"], queue_s=s["queue_s"],
        prefill_s=s["prefill_s"], decode_s=s["decode_s"], itl_count=itl.count if itl else 0,
        itl_mean_s=itl.mean_s if itl else None, itl_p50_s=itl.p50_s if itl else None,
        itl_p90_s=itl.p90_s if itl else None, itl_p99_s=itl.p99_s if itl else None,
        itl_max_s=itl.max_s if itl else None, tokens_in=s["tokens_in"] or 0, tokens_out=s["tokens_out"],
        tokens_cached=req._tokens_cached, finish_reason=req._finish_reason, error_type=req._error)

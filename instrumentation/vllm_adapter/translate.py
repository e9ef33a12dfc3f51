"""vLLM's stats records -> our metrics and per-request stage spans. No vLLM import here: the records are
read by attribute name, defensively (vLLM marks them unstable), so this core runs on plain objects too.

Per engine step (``record``): a few attribute writes for the gauges, the prefix-cache counters, and one
float appended to the step timeline (the step's inter-token gap). Per finished request: the request is
replayed through the generic API (:class:`~infersight.instrumentation.Instrumentation`) at the times
vLLM measured (its tokens' times given at once, with ``mark_tokens``), so it feeds exactly the same
histograms and root span as any other server, and, when vLLM's own tracing is on, its stage spans are
emitted as children of vLLM's ``llm_request`` span.
Nothing here runs per token.

Times. ``FinishedRequestStats`` carries intervals (engine-core clock) and ``IterationStats`` the frontend
wall-clock time of the step that finished the request. Stages are laid out backwards from that time:
decode ends there, prefill ends ``decode_time`` earlier (the first token), the queue ends
``prefill_time`` before that; the request starts ``e2e_latency`` before the end (vLLM's arrival time).

Inter-token gaps. vLLM reports each step's gaps without request ids, but a request that was in every
batch of its decode (always, unless preempted) has exactly the step-to-step gaps of the steps since its
first token. The adapter keeps the last steps' gap (the smallest in the step: the request-to-request
differences come only from preempted requests) and takes the request's ``n - 1`` most recent gaps; it
uses them only if they add up to vLLM's ``decode_time``, else (preemption, speculative decoding) it
spreads ``decode_time`` evenly, which keeps TPOT and the mean exact.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from itertools import accumulate, islice, repeat
from operator import mul
from typing import Any, NamedTuple

from opentelemetry import metrics, trace
from opentelemetry.trace import NonRecordingSpan

from infersight.instrumentation import selftelemetry as bad
from infersight.instrumentation.api import Instrumentation
from infersight.instrumentation.meters import histogram
from infersight.instrumentation.spans import Root, SpanSink
from infersight.instrumentation.summary import itl_summary
from infersight.instrumentation.vllm_adapter.edge import FIRST_TOKEN_LATENCY, EdgeRegistry, EdgeTiming
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION
from infersight.schemas.records import FINISH_REASONS
from infersight.schemas.registry import get
from infersight.schemas.units import NS

_log = logging.getLogger(__name__)
STEP_HISTORY = 65_536
_CHAT_ID_PREFIX = "chatcmpl-"  # vLLM's OpenAI server: chat request ids; plain completions are "cmpl-"


def _num(obj: Any, name: str, default: float = 0.0) -> float:
    value = getattr(obj, name, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _count(obj: Any, name: str) -> int:
    value = getattr(obj, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class _Finished(NamedTuple):
    """A finished request's figures, laid out in the frontend's clock (ns)."""

    request_id: str | None
    n_in: int
    n_out: int
    n_cached: int
    reason: str
    start: int  # engine arrival
    queued: int
    scheduled: int
    first: int  # the engine's first token
    end: int
    gaps: list[int]


class StatsTranslator:
    """Turns ``record(scheduler_stats, iteration_stats)`` calls into telemetry. One per engine."""

    def __init__(self, model: str, *, tracer_provider: Any, meter_provider: Any, vllm_tracing: bool,
                 parents: Any, gpu: bool = True, edges: EdgeRegistry | None = None) -> None:
        self.model = model
        self.edges = edges
        self.vllm_tracing = vllm_tracing
        self.parents = parents
        self._now = [0]
        clock = self._clock
        # With vLLM tracing on, vLLM's llm_request span is the request's server span: our Instrumentation
        # then only records metrics (no-op tracer) and the stage spans go under llm_request.
        inst_tp = trace.NoOpTracerProvider() if vllm_tracing else tracer_provider
        self.inst = Instrumentation(tracer_provider=inst_tp, meter_provider=meter_provider, engine="vllm",
                                    provider_name="vllm", gpu=gpu, clock=clock, wall_clock=clock)
        self._stage_spans = SpanSink(tracer_provider) if vllm_tracing else None
        self._step_gaps: deque[float] = deque(maxlen=STEP_HISTORY)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(SCOPE_NAME, SCOPE_VERSION)
        entry = get(M.ENGINE_TTFT_METRIC)
        self._engine_ttft = histogram(meter, M.ENGINE_TTFT_METRIC, entry.unit, entry.description, entry.buckets)
        self._engine_ttft_attrs = {op: {A.GEN_AI_REQUEST_MODEL: model, A.GEN_AI_OPERATION_NAME: op,
                                        A.GEN_AI_PROVIDER_NAME: "vllm"} for op in ("chat", "text_completion")}
        self.requests_seen = 0
        self.gap_fallbacks = 0

    def _clock(self) -> int:
        return self._now[0]

    def _bad(self, kind: str, detail: str) -> None:
        self.inst.self_telemetry.bad_input(kind, detail)

    # ---- per engine step ----
    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        gauges = self.inst.gauges
        if scheduler_stats is not None:
            gauges.queue_depth = _count(scheduler_stats, "num_waiting_reqs") + _count(
                scheduler_stats, "num_skipped_waiting_reqs")
            gauges.running = _count(scheduler_stats, "num_running_reqs")
            gauges.kv_cache_usage = _num(scheduler_stats, "kv_cache_usage")
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            if prefix is not None:
                queries, hits = _count(prefix, "queries"), _count(prefix, "hits")
                if queries:
                    gauges.add_prefix_cache(queries, min(hits, queries))
        if iteration_stats is None:
            return
        ttfts = getattr(iteration_stats, "time_to_first_tokens_iter", None) or ()
        gaps = getattr(iteration_stats, "inter_token_latencies_iter", None) or ()
        if ttfts or gaps:
            gauges.batch_size = len(ttfts) + len(gaps)
        if gaps:
            self._step_gaps.append(min(gaps))
        finished = getattr(iteration_stats, "finished_requests", None)
        if finished:
            end_s = _num(iteration_stats, "iteration_timestamp")
            for stats in finished:
                self.finish(stats, end_s)

    # ---- per finished request ----
    def _gaps_for(self, n_tokens: int, decode_s: float) -> list[int]:
        """The request's inter-token gaps in ns (see the module doc)."""
        k = n_tokens - 1
        if k <= 0:
            return []
        if k <= len(self._step_gaps):
            recent = list(islice(reversed(self._step_gaps), k))
            recent.reverse()
            if abs(sum(recent) - decode_s) <= max(1e-4, 0.01 * decode_s):
                return list(map(int, map(mul, recent, repeat(NS))))  # [int(g * NS) ...] without the loop
        self.gap_fallbacks += 1
        even = int(decode_s * NS / k)
        return [even] * k

    def finish(self, stats: Any, end_s: float) -> None:
        self.requests_seen += 1
        request_id = getattr(stats, "request_id", None)
        request_id = request_id if isinstance(request_id, str) else None
        durations = {}
        for name in ("e2e_latency", "queued_time", "prefill_time", "decode_time"):
            value = _num(stats, name)
            if value < 0:
                self._bad(bad.NEGATIVE_DURATION, f"vLLM FinishedRequestStats.{name}={value}")
                value = 0.0
            durations[name] = value
        if end_s <= 0:
            self._bad(bad.BAD_TYPE, "vLLM IterationStats.iteration_timestamp missing")
            return
        n_out, n_in = _count(stats, "num_generation_tokens"), _count(stats, "num_prompt_tokens")
        n_cached = min(_count(stats, "num_cached_tokens"), n_in) if n_in else 0
        reason = str(getattr(stats, "finish_reason", "stop")).lower()
        reason = reason if reason in FINISH_REASONS else "stop"

        edge = self.edges.pop(request_id) if self.edges is not None else None
        end = int(end_s * NS)
        arrival = end - int(durations["e2e_latency"] * NS)
        first_latency = _num(stats, FIRST_TOKEN_LATENCY)
        if edge is not None and n_out and first_latency > 0:
            # vLLM's own TTFT, in the frontend's clock like the edge's: engine <= edge by causality
            first = arrival + int(first_latency * NS)
        else:
            first = end - int(durations["decode_time"] * NS)
        scheduled = first - int(durations["prefill_time"] * NS)
        start = min(arrival, scheduled)
        queued = max(start, scheduled - int(durations["queued_time"] * NS))
        gaps = self._gaps_for(n_out, durations["decode_time"]) if n_out else []
        done = _Finished(request_id, n_in, n_out, n_cached, reason, start, queued, scheduled, first, end, gaps)
        if edge is None:
            self._replay(done, None)
        else:  # a request finishing before its first token's bytes were written (one token, or not streamed)
            edge.when_first_token(lambda: self._replay(done, edge))

    def _replay(self, f: _Finished, edge: EdgeTiming | None) -> None:
        """Replay a finished request through the generic API; with an edge timing, the request starts at the
        edge, ``ingress`` runs to the engine's queue and ``egress`` from the engine's first token to its bytes
        written, and the request's TTFT is the edge's (token times after the first shift by that egress)."""
        ttft_s = (f.first - f.start) / NS if f.n_out else None
        operation = "chat" if f.request_id and f.request_id.startswith(_CHAT_ID_PREFIX) else "text_completion"
        t0 = min(edge.start_ns, f.start) if edge is not None else f.start
        edge_first = edge.first_ns if edge is not None and f.n_out else None
        headers = None if self.vllm_tracing else self.parents.pop_headers(f.request_id)
        now = self._now
        now[0] = t0
        req = self.inst.request(self.model, operation=operation, headers=headers)
        req.start()
        stages: list = []
        if edge is not None:
            stage = req.stage("ingress")
            now[0] = f.queued
            stage.end()
            stages.append(("ingress", t0, f.queued, {A.STAGE: "ingress"}))
        now[0] = f.queued
        stage = req.stage("queue")
        now[0] = f.scheduled
        stage.end()
        stages.append(("queue", f.queued, f.scheduled, {A.STAGE: "queue"}))
        prefill_attrs = {A.GEN_AI_USAGE_INPUT_TOKENS: f.n_in, A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: f.n_cached}
        if ttft_s is not None:
            prefill_attrs[A.TTFT] = ttft_s
            prefill_attrs[A.ENGINE_TTFT] = ttft_s
            self._engine_ttft.record(ttft_s, self._engine_ttft_attrs[operation])
        stage = req.stage("prefill", **prefill_attrs)
        now[0] = f.first
        stage.end()
        stages.append(("prefill", f.scheduled, f.first, {A.STAGE: "prefill", **prefill_attrs}))
        marks = list(accumulate(f.gaps, initial=f.first))  # the tokens' times: first, then one per gap
        if marks[-1] > f.end:
            marks = [min(t, f.end) for t in marks]
        decode_attrs = self._decode_attributes(marks, f.n_out)
        last = f.end
        if f.n_out:
            if edge_first is not None:
                written = max(edge_first, f.first)
                egress = req.stage("egress")
                stage = req.stage("decode", **decode_attrs)
                now[0] = written
                egress.end()
                stages.append(("egress", f.first, written, {A.STAGE: "egress"}))
                req.first_token()
                later = [t + written - f.first for t in marks[1:]]  # vLLM's gaps, after the first's egress
                last = max(f.end, later[-1]) if later else f.end
            else:
                req.first_token()
                stage = req.stage("decode", **decode_attrs)
                later = marks[1:]
            req.mark_tokens(later)
            now[0] = f.end
            stage.end()
            stages.append(("decode", f.first, f.end, {A.STAGE: "decode", **decode_attrs}))
        req.usage(input_tokens=f.n_in, output_tokens=f.n_out, cached_tokens=f.n_cached)
        req.response(model=self.model, response_id=f.request_id)
        now[0] = last
        req.finish(f.reason)
        if self.vllm_tracing:
            self._emit_under_llm_request(f.request_id, stages)

    @staticmethod
    def _decode_attributes(marks: list[int], n_out: int) -> dict[str, Any]:
        attrs: dict[str, Any] = {A.GEN_AI_USAGE_OUTPUT_TOKENS: n_out}
        s = itl_summary(marks)
        if s is not None:
            attrs.update({A.TPOT: s.mean_s, A.ITL_COUNT: s.count, A.ITL_MEAN: s.mean_s, A.ITL_P50: s.p50_s,
                          A.ITL_P90: s.p90_s, A.ITL_P99: s.p99_s, A.ITL_MAX: s.max_s})
        return attrs

    def _emit_under_llm_request(self, request_id: str | None, stages: tuple) -> None:
        parent = self.parents.pop_llm_request(request_id)
        if parent is None or not parent.trace_flags.sampled:
            return
        ctx = trace.set_span_in_context(NonRecordingSpan(parent))
        path = self._stage_spans.current()  # type: ignore[union-attr]
        root = Root(ctx, parent, None, True)
        for item in stages:
            name, s_start, s_end, attrs = item
            span_context, _ = path.child_context(root)  # an SDK provider: finished spans straight to its processors
            path.emit_child(root, name, span_context, s_start, s_end, attrs, ())

    def pending(self) -> Mapping[str, int]:
        return {"headers": len(self.parents.headers), "llm_request_spans": len(self.parents.llm_request_spans)}

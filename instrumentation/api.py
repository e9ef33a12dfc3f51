"""The generic API for any Python server.

    inst = Instrumentation(engine="custom", provider_name="my-server")
    with inst.request("llama-3-8b", headers=incoming_headers) as req:   # or: async with
        with req.stage("queue"):
            ...
        with req.stage("prefill"):
            ...
        req.first_token()
        for _ in stream:
            req.token()
        req.usage(input_tokens=812, output_tokens=256)
        req.finish("stop")

Metrics are recorded for every request; spans only for sampled traces (the provider's sampler decides),
except that a sampled-out request still exports its root span alone, marked ``infersight.record_only``, as
the request's record for the streaming metrics (``INFERSIGHT_REQUEST_RECORDS=false`` turns that off).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import metrics, propagate

from infersight.instrumentation.cardinality import LabelBounds
from infersight.instrumentation.config import ENV_MAX_ERROR_TYPES, ENV_MAX_MODELS, Settings
from infersight.instrumentation.fastmetrics import HistogramBank, bank_for
from infersight.instrumentation.gpu import register_gpu_gauges
from infersight.instrumentation.meters import HISTOGRAMS, RequestMetrics, ServerGauges
from infersight.instrumentation.request import RedactHook, RequestContext, Stage
from infersight.instrumentation.selftelemetry import BAD_TYPE, SelfTelemetry
from infersight.instrumentation.spans import Root, SpanSink
from infersight.instrumentation.summary import RequestSummary, build_record, root_attributes
from infersight.instrumentation.text import as_text, is_text
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.attributes import OTHER_VALUE, SCOPE_NAME, SCOPE_VERSION
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT
from infersight.schemas.records import RequestRecord

# the per-request histograms with the request's own attribute set, in _series_for's order
_PER_REQUEST = (M.GEN_AI_SERVER_REQUEST_DURATION, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
                M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, M.ITL_P99_METRIC, M.QUEUE_TIME_METRIC)


class Instrumentation:
    """Per-process instrumentation state: instruments, span output, settings. Create one per server.

    Its requests (``request()``) capture; at finish each hands its summary here, and ``emit`` records the
    metrics, the spans and the record. ``clock``/``wall_clock`` (ns), ``spans`` (the span output) and
    ``self_telemetry`` (bad-input counting) are what its requests use."""

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None,
                 settings: Settings | None = None, engine: str = "custom", provider_name: str | None = None,
                 operation: str = "chat", capture_content: bool | None = None, redact: RedactHook | None = None,
                 on_record: Callable[[RequestRecord], None] | None = None, gpu: bool = True,
                 fast_metrics: bool = True,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 wall_clock: Callable[[], int] = time.time_ns) -> None:
        self.settings = settings or Settings.from_env()
        self.engine, self.operation = engine, operation
        self.capture_content = self.settings.capture_content if capture_content is None else capture_content
        self.redact, self.on_record = redact, on_record
        self.clock, self.wall_clock = clock, wall_clock
        meter_provider = meter_provider or metrics.get_meter_provider()
        meter = meter_provider.get_meter(SCOPE_NAME, SCOPE_VERSION)
        self.self_telemetry = SelfTelemetry(meter)
        # Histograms: aggregated in-process and bridged into the SDK's readers when the provider is the
        # SDK's (see fastmetrics); otherwise, or with fast_metrics=False, the API instruments.
        bank = bank_for(meter_provider, HISTOGRAMS, SCOPE_NAME, SCOPE_VERSION) if fast_metrics else None
        self._histograms: HistogramBank | RequestMetrics = bank if bank is not None else RequestMetrics(meter)
        self.gauges = ServerGauges(meter, engine)
        self.gpu_gauges = register_gpu_gauges(meter) if gpu else False
        self.spans = SpanSink(tracer_provider)
        self._base_span_attrs: dict[str, Any] = {A.GEN_AI_PROVIDER_NAME: provider_name or engine, A.ENGINE: engine,
                                                 A.DEPLOYMENT_TRACK: self.settings.track}
        if self.settings.model_version:
            self._base_span_attrs[A.MODEL_VERSION] = self.settings.model_version
        self._series_cache: dict[tuple, tuple] = {}  # (model, operation, error type) as given -> _series_for's
        self._folded_cache: dict[tuple, tuple] = {}  # the same for keys with a value folded, by the folded key
        telemetry, period = self.self_telemetry, self.settings.cardinality_period_s
        settings_of = {A.GEN_AI_REQUEST_MODEL: ENV_MAX_MODELS, A.ERROR_TYPE: ENV_MAX_ERROR_TYPES}
        self._bounds = LabelBounds(
            {A.GEN_AI_REQUEST_MODEL: self.settings.max_models, A.ERROR_TYPE: self.settings.max_error_types},
            period, clock, lambda label, value, limit: telemetry.folded(label, value, limit, period,
                                                                        settings_of[label]))

    @property
    def region(self) -> str:
        """INFERSIGHT_REGION, else the tracer provider's resource ``cloud.region``, else "unknown"."""
        if self.settings.region:
            return self.settings.region
        resource = getattr(self.spans.current(), "resource", None)
        region = resource.attributes.get(A.CLOUD_REGION) if resource is not None else None
        return str(region) if region else "unknown"

    def request(self, model: str, *, operation: str | None = None, headers: Mapping[str, str] | None = None,
                context: Any = None) -> RequestContext:
        """A request context. Parent: W3C trace context from ``headers`` if given, else ``context``, else
        the current context. Starts on ``with``/``async with`` or ``.start()``."""
        if not isinstance(model, str) or not model:
            self.self_telemetry.bad_input(BAD_TYPE, f"request model {model!r} must be a non-empty string")
            model = as_text(model)  # str(model), or "unknown" when that is empty or raises
        parent = context
        if headers is not None:
            try:
                parent = propagate.extract(headers)
            except Exception as exc:  # noqa: BLE001 - a malformed carrier must not fail the request
                self.self_telemetry.bad_input(BAD_TYPE, f"could not read trace context from headers: {exc!r}")
        return RequestContext(self, model, operation or self.operation, parent)

    # ---- called by RequestContext ----
    def span_name(self, model: str, operation: str) -> str:
        """The root span's name (GenAI semconv: "{gen_ai.operation.name} {gen_ai.request.model}")."""
        return f"{operation} {model}"

    def _series_for(self, model: str, operation: str, error_type: str | None) -> tuple:
        """The request's metric handles (duration, TTFT, TPOT, ITL p99, queue, input and output tokens) by model,
        operation and error type, the attributes recorded as ``_OTHER`` (None: none) and the labels that replace
        bad ones (None: none; see ``_replaced_series``): resolved once per key and period
        (``_resolve_series``), a dict lookup per request."""
        key = (model, operation, error_type)
        try:
            cached = self._series_cache.get(key)
        except TypeError:  # an unhashable label (the operation is the caller's, unchecked): bad input, counted there
            cached = None
        if cached is None:
            cached = self._resolve_series(key)
        return cached

    def _resolve_series(self, key: tuple) -> tuple:
        """``_series_for`` on a cache miss: the model and error type through their per-label bounds
        (``cardinality``), then the series of the attribute set. Cached only when nothing was folded, so a
        folded key comes back here (and a period's end is seen) until a later period admits its values."""
        model, operation, error_type = key
        if not (is_text(model) and is_text(operation) and (error_type is None or is_text(error_type))):
            return self._replaced_series(model, operation, error_type)
        bounds = self._bounds
        generation = bounds.generation
        model_ok = bounds.admit(A.GEN_AI_REQUEST_MODEL, model)
        error_ok = error_type is None or bounds.admit(A.ERROR_TYPE, error_type)
        if bounds.generation != generation:  # a period ended: what was admitted before is admitted again
            self._series_cache.clear()
            self._folded_cache.clear()
            generation = bounds.generation
        if model_ok and error_ok:
            cached = (*self._new_series(model, operation, error_type), None, None)
            cache = self._series_cache
        else:
            folded = (A.GEN_AI_REQUEST_MODEL,) if not model_ok else ()
            if not error_ok:
                folded += (A.ERROR_TYPE,)
            model, error_type = model if model_ok else OTHER_VALUE, error_type if error_ok else OTHER_VALUE
            key = (model, operation, error_type, folded)
            cached = self._folded_cache.get(key)
            if cached is not None:
                return cached
            cached = (*self._new_series(model, operation, error_type), folded, None)
            cache = self._folded_cache
        # bounded: models x operations x error types; never across a period's end (a racing request's admission)
        if len(cache) < 10_000 and bounds.generation == generation:
            cache[key] = cached
        return cached

    def _replaced_series(self, model: Any, operation: Any, error_type: Any) -> tuple:
        """``_resolve_series`` for labels that are not text both OTLP encoders can write (``text.is_text``): a
        model or error type with a lone surrogate (which becomes U+FFFD), an operation that is not a string (the
        instrumentation's default operation instead). Each is counted as ``bad_type``, per request (never cached
        under the bad key), and the request is recorded with the replacements: its metrics, spans and record."""
        bad_input = self.self_telemetry.bad_input
        if not is_text(model):
            bad_input(BAD_TYPE, f"request model {model!r:.100} is not valid text; lone surrogates recorded as U+FFFD")
            model = as_text(model)
        if not isinstance(operation, str):
            bad_input(BAD_TYPE, f"request operation {operation!r:.100} is not a string; recorded as "
                      f"{self.operation!r:.100}")
            operation = as_text(self.operation)
        elif not is_text(operation):
            bad_input(BAD_TYPE, f"request operation {operation!r:.100} is not valid text; lone surrogates recorded "
                      "as U+FFFD")
            operation = as_text(operation)
        if error_type is not None and not is_text(error_type):
            bad_input(BAD_TYPE, f"error type {error_type!r:.100} is not valid text; lone surrogates recorded as U+FFFD")
            error_type = as_text(error_type)
        return (*self._series_for(model, operation, error_type)[:-1], (model, operation, error_type))

    def _new_series(self, model: str, operation: str, error_type: str | None) -> tuple:
        """The seven metric handles of one attribute set (the bank is the meter provider's, shared by every
        Instrumentation on it: the whole set is the key)."""
        base = {A.GEN_AI_REQUEST_MODEL: model, A.GEN_AI_OPERATION_NAME: operation,
                A.GEN_AI_PROVIDER_NAME: self._base_span_attrs[A.GEN_AI_PROVIDER_NAME],
                A.DEPLOYMENT_TRACK: self.settings.track}
        if self.settings.model_version:
            base[A.MODEL_VERSION] = self.settings.model_version
        if error_type:
            base[A.ERROR_TYPE] = error_type
        series, set_key = self._histograms.series, tuple(base.items())
        return (*(series(name, set_key, base) for name in _PER_REQUEST),
                series(M.GEN_AI_CLIENT_TOKEN_USAGE, (set_key, "input"), {**base, A.GEN_AI_TOKEN_TYPE: "input"}),
                series(M.GEN_AI_CLIENT_TOKEN_USAGE, (set_key, "output"), {**base, A.GEN_AI_TOKEN_TYPE: "output"}))

    def emit(self, s: RequestSummary, root: Root | None, stages: Sequence[Stage], events: Sequence[tuple],
             content: dict[str, str] | None, wall_offset: int) -> None:
        """A finished request's telemetry from its summary: the metrics (every request), its spans (a
        sampled trace: root and ``stages``, root ``events``) or its record-only root span, and the record
        (``on_record``). ``content``: captured prompt and completion attributes; ``wall_offset`` turns the
        stages' clock into wall-clock ns."""
        duration, ttft, tpot, itl_p99, queue, tokens_in, tokens_out, folded, replaced = self._series_for(
            s.model, s.operation, s.error_type)
        if replaced is not None:  # bad labels (counted): the spans and the record carry their replacements too
            s.model, s.operation, s.error_type = replaced
        obs = [(duration, s.e2e_s), (tokens_out, s.tokens_out)]
        add = obs.append
        if s.error_type is None:  # semconv: TTFT and TPOT describe successful responses
            if (value := s.ttft_s) is not None:
                add((ttft, value))
            if (value := s.tpot_s) is not None:
                add((tpot, value))
        if (itl := s.itl) is not None:
            add((itl_p99, itl.p99_s))
        if (value := s.queue_s) is not None:
            add((queue, value))
        if (value := s.tokens_in) is not None:
            add((tokens_in, value))
        self._histograms.record_series(obs)
        if s.prefix_queried:
            self.gauges.add_prefix_cache(s.prefix_queried, s.tokens_cached)
        if root is not None and root.sampled:
            spans = [(st.name, st.span_context, st.start_ns + wall_offset, st.end_ns + wall_offset,  # type: ignore[operator]
                      st.attributes or {A.STAGE: st.name},
                      [(n, a, t + wall_offset) for n, a, t in st.events] if st.events else ())
                     for st in stages]
            attrs = root_attributes(s, self._base_span_attrs, content)
            if folded is not None:  # the span keeps the real values and says which ones its metrics folded
                attrs[A.CARDINALITY_FOLDED] = folded
            name = root.name if replaced is None else self.span_name(s.model, s.operation)
            self.spans.current().emit(root, name, s.start_ns, s.end_ns, attrs, events, s.error_type, spans)
        elif root is not None and self.settings.request_records:
            attrs = root_attributes(s, self._base_span_attrs, content)
            if folded is not None:
                attrs[A.CARDINALITY_FOLDED] = folded
            name = root.name if replaced is None else self.span_name(s.model, s.operation)
            self.spans.current().emit_record(root, name, s.start_ns, s.end_ns, attrs, s.error_type)
        if self.on_record is not None:
            self.on_record(self.request_record(s, root))

    def request_record(self, s: RequestSummary, root: Root | None) -> RequestRecord:
        """The contract's per-request record of a finished request."""
        if root is not None:
            trace_id, span_id = format(root.span_context.trace_id, "032x"), format(root.span_context.span_id, "016x")
        else:
            trace_id, span_id = "0" * 32, ""
        return build_record(s, trace_id, span_id, self.region, self.settings.model_version, self.settings.track,
                            self.engine)

    def emit_late_evaluation(self, root: Root, attrs: dict, at_ns: int, model: str = "") -> None:
        """An evaluation that arrives after the root span was exported rides on a small child span. For a trace
        the sampler dropped it is exported alone, marked record-only, like the root's record: the quality job
        weights by the judge's sample rate, which must not silently shrink by the trace sampler's."""
        path = self.spans.current()
        # the request's series, so an evaluation record stands alone (no join needed to key it)
        span_attrs = {A.GEN_AI_REQUEST_MODEL: model, A.MODEL_VERSION: self.settings.model_version,
                      A.DEPLOYMENT_TRACK: self.settings.track}
        events = [(GEN_AI_EVALUATION_RESULT, attrs, at_ns)]
        if not root.sampled:
            path.emit_record_child(root, "gen_ai.evaluation", at_ns, at_ns, span_attrs, events)
            return
        span_context, _ctx = path.child_context(root)
        path.emit_child(root, "gen_ai.evaluation", span_context, at_ns, at_ns, span_attrs, events)

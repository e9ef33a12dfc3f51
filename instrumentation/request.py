"""One inference request, captured: stages, token marks, usage, outcome. At finish it is summarised once
(``summary.summarise``) and handed to its ``Instrumentation``, which emits metrics, spans and the record.

Per token the only work is appending a clock reading to a list. Everything else (TTFT, ITL summary,
TPOT, stage durations) is computed once when the request finishes; metrics are recorded for every
request, spans are built only for sampled traces. No method raises into serving code: bad input is
counted on the self-telemetry counter (see ``selftelemetry``) and ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as context_api
from opentelemetry import propagate

from infersight.instrumentation import selftelemetry as bad
from infersight.instrumentation.spans import context_ops
from infersight.instrumentation.summary import RequestSummary, summarise
from infersight.instrumentation.text import as_text, is_text
from infersight.schemas import attributes as A
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT, SAFETY_CHECK_EVENT
from infersight.schemas.records import FINISH_REASONS, RequestRecord

if TYPE_CHECKING:
    from infersight.instrumentation.api import Instrumentation

STAGES = ("routing", "queue", "prefill", "decode", "safety", "ingress", "egress")
_STAGE_SET = frozenset(STAGES)
_NEW, _STARTED, _FINISHED = 0, 1, 2
_SEVERITY = {v: i for i, v in enumerate(A.SAFETY_VERDICTS)}


_attach, _reset = context_ops()[1:]


def _detach(token: Any) -> None:
    try:
        _reset(token)
    except Exception:  # noqa: BLE001 - e.g. a token from another context: the API's detach logs it, never raises
        context_api.detach(token)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Stage:
    """A stage of a request (routing, queue, prefill, decode, safety) and its span: ``with req.stage("queue"):``
    or ``.end()``. What it captured is its fields: ``name``; ``start_ns`` and ``end_ns`` (None while open) in
    the request's clock; ``attributes`` (None: only the stage name); ``events`` (name, attributes, clock
    time) of a sampled stage; and, sampled, its ``span_context`` and the ``context`` to make current in it.

    Made by RequestContext with object.__new__ and slot stores (five per request: cheaper than an __init__
    call). It holds its Instrumentation, not its request, so a request and its stages form no reference
    cycle (freed by reference counting, never left to the garbage collector)."""

    __slots__ = ("_inst", "_token", "attributes", "context", "end_ns", "events", "name", "span_context", "start_ns")

    name: str
    start_ns: int
    end_ns: int | None
    attributes: dict[str, Any] | None
    events: list[tuple] | tuple
    span_context: Any
    context: Any

    def __enter__(self) -> Stage:
        if self.context is not None:  # sampled: user spans inside the stage nest under it
            self._token = _attach(self.context)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._token is not None:
            _detach(self._token)
            self._token = None
        if exc is not None:
            self.set_attribute(A.ERROR_TYPE, type(exc).__qualname__)
        if self.end_ns is None:  # end(), inlined: this runs for every stage of every request
            self.end_ns = self._inst.clock()
        return False

    def end(self) -> None:
        if self.end_ns is None:
            self.end_ns = self._inst.clock()

    def set_attribute(self, key: str, value: Any) -> None:
        if not isinstance(key, str):  # an attribute key must be a string (an unhashable one would raise here)
            self._inst.self_telemetry.bad_input(bad.BAD_TYPE, f"set_attribute() key {key!r:.80} is not a string; "
                                                "attribute dropped")
            return
        if self.attributes is None:
            self.attributes = {A.STAGE: self.name}
        self.attributes[key] = value

    def verdict(self, verdict: str, check: str | None = None) -> None:
        """A guardrail verdict (pass, flag, block); the stage keeps the most severe one seen."""
        try:
            severity = _SEVERITY.get(verdict)
        except TypeError:  # unhashable: not a verdict either
            severity = None
        if severity is None:
            self._inst.self_telemetry.bad_input(
                bad.UNKNOWN_VALUE, f"safety verdict {verdict!r:.80} is not one of {A.SAFETY_VERDICTS}")
            return
        attrs = self.attributes if self.attributes is not None else {}
        current = attrs.get(A.SAFETY_VERDICT)
        if current is None or severity > _SEVERITY[current]:
            self.set_attribute(A.SAFETY_VERDICT, verdict)
        if self.context is not None:
            event_attrs = {A.SAFETY_VERDICT: verdict, A.SAFETY_DIRECTION: attrs.get(A.SAFETY_DIRECTION, "")}
            if check:
                event_attrs[A.SAFETY_CHECK] = check
            self.events.append((SAFETY_CHECK_EVENT, event_attrs, self._inst.clock()))  # type: ignore[union-attr]


_new_stage = object.__new__


class RequestContext:
    """Created by :meth:`Instrumentation.request`; use as ``with`` / ``async with`` or start()/finish()."""

    __slots__ = ("_inst", "_clock", "model", "operation", "_parent_ctx", "_start", "_wall0", "_first", "_ticks",
                 "token", "_stages", "_events", "_root", "_ctx_token", "_state", "_error",
                 "_tokens_in", "_tokens_out", "_tokens_cached", "_prefix_queried", "_response_model",
                 "_response_id", "_content", "_summary", "_quiet")

    def __init__(self, inst: Instrumentation, model: str, operation: str, parent_ctx: Any) -> None:
        self._inst, self._clock = inst, inst.clock
        self.model, self.operation, self._parent_ctx = model, operation, parent_ctx
        self._start = self._wall0 = 0
        self._first: int | None = None
        ticks: list[int] = []
        append, clock = ticks.append, inst.clock

        def token() -> None:
            """Mark one generated token (after the first): a clock read and a list append."""
            append(clock())

        self._ticks, self.token = ticks, token
        self._stages: list[Stage] = []
        self._events: list[tuple] = []
        self._root: Any = None
        self._ctx_token: Any = None
        self._state = _NEW
        self._error: str | None = None
        self._tokens_in: int | None = None
        self._tokens_out: int | None = None
        self._tokens_cached = 0
        self._prefix_queried = 0
        self._response_model: str | None = None
        self._response_id: str | None = None
        self._content: dict[str, str] | None = None
        self._summary: RequestSummary | None = None
        self._quiet = False  # started, with a root span the sampler dropped: stages need no span ids

    # ---- lifecycle ----
    def start(self) -> RequestContext:
        if self._state != _NEW:
            self._bad(bad.DOUBLE_START, "start() called twice")
            return self
        inst = self._inst
        self._wall0, self._start = inst.wall_clock(), self._clock()
        self._state = _STARTED
        try:
            self._root = inst.spans.current().begin(inst.span_name(self.model, self.operation), self._parent_ctx,
                                                    self._wall0)
        except Exception as exc:  # noqa: BLE001 - a broken tracer must not break the request
            self._bad(bad.INTERNAL, f"starting the root span failed: {exc!r}")
        self._quiet = self._root is not None and not self._root.sampled
        return self

    def __enter__(self) -> RequestContext:
        self.start()
        if self._root is not None:
            self._ctx_token = _attach(self._root.context)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and self._state == _STARTED:
            self.error(exc)
        if self._state == _STARTED:
            self.finish("error" if exc is not None else None)
        token = self._ctx_token
        if token is not None:
            self._ctx_token = None
            try:  # _detach, inlined (every request)
                _reset(token)
            except Exception:  # noqa: BLE001
                context_api.detach(token)
        return False

    async def __aenter__(self) -> RequestContext:
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        return self.__exit__(exc_type, exc, tb)

    @property
    def context(self) -> context_api.Context | None:
        """The OpenTelemetry context whose current span is this request's root span."""
        return self._root.context if self._root is not None else None

    @property
    def sampled(self) -> bool:
        return bool(self._root is not None and self._root.sampled)

    def inject(self, carrier: MutableMapping[str, str]) -> MutableMapping[str, str]:
        """Write W3C trace context (traceparent/tracestate, via the configured propagator) into carrier."""
        if self._root is not None:
            propagate.inject(carrier, context=self._root.context)
        return carrier

    # ---- stages ----
    def stage(self, name: str, **attributes: Any) -> Stage:
        """Open a stage span now; close it by leaving the ``with`` block or calling ``.end()``."""
        try:
            other = attributes or not self._quiet or name not in _STAGE_SET
        except TypeError:  # an unhashable name: _open counts it
            other = True
        if other:
            return self._open(name, {A.STAGE: name, **attributes} if attributes else None)
        # A well-formed stage of a sampled-out request (every stage of most requests): _open, inlined.
        stage = _new_stage(Stage)
        stage.name, stage.start_ns, stage.end_ns, stage.attributes = name, self._clock(), None, None
        stage.events, stage.span_context, stage.context = (), None, None
        stage._inst, stage._token = self._inst, None
        self._stages.append(stage)
        return stage

    def safety(self, direction: str, check: str | None = None) -> Stage:
        """A guardrail stage on the ``input`` or ``output``; report with ``.verdict("pass"|"flag"|"block")``."""
        if direction not in ("input", "output"):
            self._bad(bad.UNKNOWN_VALUE, f"safety direction {direction!r} is not input or output")
        attrs = {A.STAGE: "safety", A.SAFETY_DIRECTION: direction}
        if check:
            attrs[A.SAFETY_CHECK] = check
        return self._open("safety", attrs)

    def _open(self, name: str, attrs: dict | None) -> Stage:
        now = self._clock()
        started = self._state == _STARTED
        if not started:
            self._bad(bad.NOT_STARTED if self._state == _NEW else bad.AFTER_FINISH, f"stage({name!r})")
        try:
            known = name in _STAGE_SET
        except TypeError:  # unhashable
            known = False
        if not known:
            name = self._unknown_stage(name)
            if attrs is not None:
                attrs[A.STAGE] = name
        stage = _new_stage(Stage)  # five per request: slot stores here cost less than an __init__ call
        stage.name, stage.start_ns, stage.end_ns, stage.attributes = name, now, None, attrs
        stage._inst, stage._token = self._inst, None
        root = self._root
        if root is not None and root.sampled:
            span_context, ctx = self._inst.spans.current().child_context(root)
            stage.span_context, stage.context = span_context, ctx if span_context is not None else None
            stage.events = []
        else:  # no span will be built: no ids, no context, no event list
            stage.events, stage.span_context, stage.context = (), None, None
        if started:
            self._stages.append(stage)
        return stage

    def _unknown_stage(self, name: Any) -> str:
        """A stage name not among ``STAGES``, counted: a string is kept (lone surrogates replaced, so both OTLP
        encoders can write the span), anything else is counted as a bad type and named by its ``str``."""
        if isinstance(name, str):
            self._bad(bad.UNKNOWN_STAGE, f"stage {name!r:.80} is not one of {STAGES}")
            return name if is_text(name) else as_text(name)
        self._bad(bad.BAD_TYPE, f"stage name {name!r:.80} is not a string; named by its str()")
        return as_text(name)

    def end_stage(self, name: str) -> None:
        """Close the latest open stage called ``name`` (for stages that end in another callback)."""
        for stage in reversed(self._stages):
            if stage.name == name and stage.end_ns is None:
                stage.end_ns = self._clock()
                return
        self._bad(bad.STAGE_NOT_OPEN, f"end_stage({name!r}) without an open {name!r} stage")

    # ---- tokens, usage, outcome ----
    def first_token(self) -> None:
        now = self._clock()
        if self._state != _STARTED:
            self._bad(bad.NOT_STARTED if self._state == _NEW else bad.AFTER_FINISH, "first_token()")
        elif self._first is not None or self._ticks:
            self._bad(bad.TOKEN_BEFORE_FIRST_TOKEN, "first_token() after tokens were already marked")
            if self._first is None:
                self._first = now
        else:
            self._first = now

    def mark_tokens(self, times_ns: Sequence[int]) -> None:
        """Tokens after the first whose times were taken elsewhere (an engine's own timings, reported after the
        fact), in this request's clock (ns), in order: ``token()`` for each, without the calls."""
        if self._state != _STARTED:
            self._bad(bad.NOT_STARTED if self._state == _NEW else bad.AFTER_FINISH, "mark_tokens()")
            return
        try:
            times = times_ns if type(times_ns) is list else list(times_ns)
            ordered = sorted(times)  # linear on the ordered input it normally gets
        except TypeError:
            ordered = None
        if ordered is None or (ordered and not isinstance(ordered[0], int | float)):  # mutually ordered: all alike
            self._bad(bad.BAD_TYPE, f"mark_tokens() needs clock readings in ns, got {times_ns!r:.80}")
            return
        if ordered != times or (self._ticks and ordered and ordered[0] < self._ticks[-1]):
            self._bad(bad.NEGATIVE_DURATION, "mark_tokens() times out of order; put in order")
            ordered = sorted(self._ticks + ordered)
            self._ticks.clear()
        self._ticks.extend(ordered)

    def usage(self, input_tokens: int | None = None, output_tokens: int | None = None,
              cached_tokens: int | None = None) -> None:
        """Token counts from the engine (output defaults to the number of token marks)."""
        if ((input_tokens is None or (type(input_tokens) is int and input_tokens >= 0))
                and (output_tokens is None or (type(output_tokens) is int and output_tokens >= 0))
                and (cached_tokens is None or (type(cached_tokens) is int and cached_tokens >= 0))):
            if input_tokens is not None:  # well-formed (the usual case): no per-field checks below
                self._tokens_in = input_tokens
            if output_tokens is not None:
                self._tokens_out = output_tokens
            if cached_tokens is not None:
                self._tokens_cached = cached_tokens
            return
        for label, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens),
                             ("cached_tokens", cached_tokens)):
            if value is None:
                continue
            if not _is_count(value):
                self._bad(bad.BAD_TYPE, f"usage({label}={value!r}) is not an integer")
            elif value < 0:
                self._bad(bad.NEGATIVE_VALUE, f"usage({label}={value})")
            elif label == "input_tokens":
                self._tokens_in = value
            elif label == "output_tokens":
                self._tokens_out = value
            else:
                self._tokens_cached = value

    def prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        """Prompt tokens looked up in / served from the prefix cache."""
        if not (_is_count(queried_tokens) and _is_count(hit_tokens)):
            self._bad(bad.BAD_TYPE, f"prefix_cache({queried_tokens!r}, {hit_tokens!r}) needs integers")
        elif queried_tokens < 0 or hit_tokens < 0 or hit_tokens > queried_tokens:
            self._bad(bad.NEGATIVE_VALUE, f"prefix_cache({queried_tokens}, {hit_tokens}): need 0 <= hits <= "
                      "queried")
        else:
            self._prefix_queried, self._tokens_cached = queried_tokens, hit_tokens

    def response(self, model: str | None = None, response_id: str | None = None) -> None:
        self._response_model, self._response_id = model, response_id

    def error(self, error: BaseException | str) -> None:
        """Mark the request failed; ``error.type`` is the exception's class name or the given code."""
        if isinstance(error, BaseException):
            self._error = type(error).__qualname__
        elif isinstance(error, str) and error:
            self._error = error
        else:
            self._bad(bad.BAD_TYPE, f"error({error!r}) needs an exception or a non-empty string")

    def prompt(self, text: str) -> None:
        self._capture(A.GEN_AI_INPUT_MESSAGES, "user", text)

    def completion(self, text: str) -> None:
        self._capture(A.GEN_AI_OUTPUT_MESSAGES, "assistant", text)

    def _capture(self, key: str, role: str, text: str) -> None:
        inst = self._inst
        if not inst.capture_content:
            return
        try:
            redacted = inst.redact(text) if inst.redact is not None else text
        except Exception as exc:  # noqa: BLE001 - drop the text rather than record it unredacted
            self._bad(bad.REDACTION_FAILED, f"the redaction hook raised {exc!r}; text dropped")
            return
        if not isinstance(redacted, str):
            self._bad(bad.BAD_TYPE, "the redaction hook must return a string; text dropped")
            return
        if self._content is None:
            self._content = {}
        self._content[key] = json.dumps([{"role": role, "parts": [{"type": "text", "content": redacted}]}])

    def evaluation(self, name: str, score_value: float | None = None, score_label: str | None = None,
                   sample_rate: float = 1.0, explanation: str | None = None) -> None:
        """A quality judge's result, as a ``gen_ai.evaluation.result`` event with its sample rate."""
        if not isinstance(name, str) or not name:
            self._bad(bad.BAD_TYPE, f"evaluation name {name!r} must be a non-empty string")
            return
        if not (isinstance(sample_rate, int | float) and 0 < sample_rate <= 1):
            self._bad(bad.UNKNOWN_VALUE, f"evaluation sample_rate {sample_rate!r} must be in (0, 1]")
            return
        attrs: dict[str, Any] = {A.GEN_AI_EVALUATION_NAME: name, A.EVALUATION_SAMPLE_RATE: float(sample_rate)}
        if score_value is not None:
            try:
                attrs[A.GEN_AI_EVALUATION_SCORE_VALUE] = float(score_value)
            except Exception:  # noqa: BLE001 - ValueError, TypeError, OverflowError, a hostile __float__
                self._bad(bad.BAD_TYPE, f"evaluation score {score_value!r:.80} is not a number; recorded without it")
        if score_label is not None:
            attrs[A.GEN_AI_EVALUATION_SCORE_LABEL] = score_label
        if explanation is not None:
            attrs[A.GEN_AI_EVALUATION_EXPLANATION] = explanation
        now = self._inst.wall_clock()
        if self._state != _FINISHED:
            self._events.append((GEN_AI_EVALUATION_RESULT, attrs, now))
        elif self._root is not None:  # late judge: a small child span carries it (record-only if sampled out)
            self._inst.emit_late_evaluation(self._root, attrs, now, self.model)

    def finish(self, reason: str | None = "stop") -> None:
        """End the request: summarise it, then its Instrumentation records metrics, emits spans (sampled) and
        the record (if a sink).

        ``reason`` is one of ``FINISH_REASONS``; None means "error" if an error was set, else "stop"."""
        now = self._clock()
        if self._state != _STARTED:
            if self._state == _NEW:
                self._bad(bad.NOT_STARTED, "finish() before start()")
            else:
                self._bad(bad.DOUBLE_FINISH, "finish() called twice; the first one counts")
            return
        self._state = _FINISHED
        self._quiet = False
        if reason is not None and reason not in FINISH_REASONS:
            self._bad(bad.UNKNOWN_VALUE, f"finish reason {reason!r} is not one of {FINISH_REASONS}")
            reason = None  # the record keeps to the contract's reasons
        try:
            ticks, first, start, stages = self._ticks, self._first, self._start, self._stages
            if first is not None and (not ticks or ticks[0] >= first):  # well-formed: token_times(), inlined
                times = [first, *ticks]
            else:
                times = self.token_times()
            for stage in stages:
                if stage.start_ns < start or stage.end_ns is None:
                    self._repair_stage(stage, start, now)
            wall_offset = self._wall0 - start
            self._summary = summary = summarise(
                self.model, self.operation, start, now, wall_offset, times, stages, self._tokens_in,
                self._tokens_out, self._tokens_cached, self._prefix_queried,
                reason if reason is not None else ("error" if self._error else "stop"), self._error,
                self._response_model, self._response_id)
            self._inst.emit(summary, self._root, stages, self._events, self._content, wall_offset)
        except Exception as exc:  # noqa: BLE001
            self._bad(bad.INTERNAL, f"completing the request failed: {exc!r}")

    # ---- results ----
    def token_times(self) -> list[int]:
        """First token then every later mark, cleaned of bad input (counted)."""
        ticks, first, start = self._ticks, self._first, self._start
        if ticks and ticks[0] < start:
            self._bad(bad.TOKEN_OUTSIDE_REQUEST, "token() marked before the request started")
            ticks = [t for t in ticks if t >= start]
        if first is None:
            return list(ticks)
        if ticks and ticks[0] < first:
            self._bad(bad.TOKEN_BEFORE_FIRST_TOKEN, "token() marked before first_token()")
            return sorted([first, *ticks])
        return [first, *ticks]

    def summary(self) -> RequestSummary | None:
        """The finished request's figures (seconds; see ``summary.RequestSummary``), None before finish."""
        return self._summary

    def record(self) -> RequestRecord | None:
        """The per-request record of the contract (``infersight.schemas.records``), None before finish."""
        return self._inst.request_record(self._summary, self._root) if self._summary is not None else None

    # ---- internals ----
    def _bad(self, kind: str, detail: str) -> None:
        self._inst.self_telemetry.bad_input(kind, detail)

    def _repair_stage(self, stage: Stage, start: int, end: int) -> None:
        """A stage that began before the request or was never closed: counted, then clamped to the request."""
        if stage.start_ns < start:
            self._bad(bad.NEGATIVE_DURATION, f"stage {stage.name!r} started before the request")
            stage.start_ns = start
        if stage.end_ns is None:
            self._bad(bad.STAGE_LEFT_OPEN, f"stage {stage.name!r} still open at finish; closed there")
            stage.end_ns = end


RedactHook = Callable[[str], str]

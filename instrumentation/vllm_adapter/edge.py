"""The edge timer: time to first token as the vLLM OpenAI server's HTTP layer sees it.

``EdgeTimer`` is an ASGI wrapper (outermost: around every middleware of the app) that, for the generation
routes, reads the clock when the server calls the app with a request and when the first token's bytes are
handed to the server's transport (the ``send`` of the first body chunk that carries a token: for a stream,
the first SSE event with text, reasoning or a tool call — vLLM's role-only first chunk carries none; for a
whole response, its body). Its ``EdgeTiming`` rides in a context variable into the request's handler, where
the plugin's ``AsyncLLM.add_request`` wrapper files it under the engine's request id (``EDGES``); the stats
translator takes it from there when vLLM reports the request finished, so the edge and the engine's
figures of one request join without any id in the HTTP layer.

Installation without changing vLLM's code: the plugin (built inside the server before its app exists)
wraps the launcher's ``build_app`` so the built app's middleware stack is wrapped (``install``); for other
vLLM layouts, ``--middleware infersight.instrumentation.vllm_adapter.edge.EdgeTimer`` adds it through
vLLM's own option (then inside vLLM's CORS/auth middleware).

The clock is ``time.time_ns``: vLLM's arrival and step times are ``time.time()`` of the same process, so
edge, ingress, engine stages and egress lie on one clock.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from infersight.instrumentation.vllm_adapter.looplag import LoopLag
from infersight.instrumentation.vllm_adapter.tracecontext import MAX_PENDING, _BoundedMap

_log = logging.getLogger(__name__)

GENERATION_PATHS = frozenset(("/v1/chat/completions", "/v1/completions"))
FIRST_TOKEN_LATENCY = "first_token_latency"  # set on FinishedRequestStats by install_first_token_latency
_TOKEN_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class EdgeTiming:
    """One HTTP request's edge times (ns, ``time.time_ns``) and who waits for its first token."""

    __slots__ = ("start_ns", "first_ns", "closed", "waiters")

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.first_ns: int | None = None
        self.closed = False
        self.waiters: list[Callable[[], None]] = []

    def when_first_token(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the first token was handed over or the response ended without one."""
        if self.first_ns is not None or self.closed:
            callback()
        else:
            self.waiters.append(callback)

    def _release(self) -> None:
        waiters, self.waiters = self.waiters, []
        for callback in waiters:
            try:
                callback()
            except Exception:  # noqa: BLE001 - telemetry never breaks the response
                _log.exception("infersight: edge callback failed")


CURRENT: contextvars.ContextVar[EdgeTiming | None] = contextvars.ContextVar("infersight_edge", default=None)


class EdgeRegistry:
    """Edge timings of in-flight engine requests, by the engine's request id (bounded like the trace maps)."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self._by_request = _BoundedMap(limit)
        self.lag: LoopLag | None = None  # the API server's event-loop lag monitor, started on the first request

    def file_current(self, request_id: Any) -> None:
        """Called where the engine gets the request: the current HTTP request's timing under its id."""
        timing = CURRENT.get()
        if timing is not None and isinstance(request_id, str):
            self._by_request.put(request_id, timing)

    def pop(self, request_id: str | None) -> EdgeTiming | None:
        return self._by_request.pop(request_id) if request_id else None

    def __len__(self) -> int:
        return len(self._by_request)


EDGES = EdgeRegistry()


def carries_token(body: bytes) -> bool:
    """Whether an SSE chunk of vLLM's OpenAI server carries generated text, reasoning or a tool call."""
    for line in body.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        for choice in (event.get("choices") or ()) if isinstance(event, dict) else ():
            if not isinstance(choice, dict):
                continue
            if choice.get("text"):  # /v1/completions
                return True
            delta = choice.get("delta")
            if isinstance(delta, dict) and any(delta.get(key) for key in _TOKEN_DELTA_KEYS):
                return True
    return False


class EdgeTimer:
    """ASGI wrapper timing the generation routes (see the module doc). Usable as a Starlette middleware."""

    def __init__(self, app: ASGIApp, registry: EdgeRegistry = EDGES,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.app, self.registry, self.clock = app, registry, clock

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        clock = self.clock
        timing = EdgeTiming(clock())
        lag = self.registry.lag
        if lag is not None:
            lag.ensure_started()
        stream = [False]
        ok = [True]

        async def timed_send(message: Message) -> None:
            await send(message)
            if timing.first_ns is not None or not ok[0]:
                return
            kind = message.get("type")
            if kind == "http.response.start":
                ok[0] = int(message.get("status", 200)) < 400
                for key, value in message.get("headers") or ():
                    if key.lower() == b"content-type":
                        stream[0] = value.startswith(b"text/event-stream")
            elif kind == "http.response.body":
                body = message.get("body") or b""
                if body and (not stream[0] or carries_token(body)):
                    timing.first_ns = clock()
                    timing._release()

        token = CURRENT.set(timing)
        try:
            await self.app(scope, receive, timed_send)
        finally:
            CURRENT.reset(token)
            timing.closed = True
            timing._release()


_BUILD_APP_MARK = "__infersight_edge__"


def _wrap_app(app: Any, registry: EdgeRegistry) -> Any:
    """Make ``EdgeTimer`` the outermost layer of a Starlette/FastAPI app's middleware stack."""
    build = getattr(app, "build_middleware_stack", None)
    if build is None or getattr(build, _BUILD_APP_MARK, False):
        return app

    @functools.wraps(build)
    def build_middleware_stack() -> Any:
        return EdgeTimer(build(), registry)

    setattr(build_middleware_stack, _BUILD_APP_MARK, True)
    app.build_middleware_stack = build_middleware_stack
    built = getattr(app, "middleware_stack", None)
    if built is not None:  # vLLM's build_app already built it (its SageMaker bootstrap does)
        app.middleware_stack = EdgeTimer(built, registry)
    return app


def install(registry: EdgeRegistry = EDGES) -> bool:
    """Wrap the OpenAI server launcher's ``build_app`` (once per process) so its app is edge-timed; False
    where this vLLM has no such launcher (then use ``--middleware``, see the module doc)."""
    try:
        from vllm.entrypoints.launchers.api_server import entry
    except ImportError:
        _log.info("infersight: no vLLM API-server launcher here; edge timing only with --middleware %s.%s",
                  __name__, EdgeTimer.__name__)
        return False
    original = getattr(entry, "build_app", None)
    if original is None:
        return False
    if getattr(original, _BUILD_APP_MARK, False):
        return True

    @functools.wraps(original)
    def build_app(*args: Any, **kwargs: Any) -> Any:
        return _wrap_app(original(*args, **kwargs), registry)

    setattr(build_app, _BUILD_APP_MARK, True)
    entry.build_app = build_app
    return True


def install_first_token_latency() -> bool:
    """Copy vLLM's per-request first-token latency (frontend clock, what ``vllm:time_to_first_token_seconds``
    records) onto its ``FinishedRequestStats``, which in vLLM 0.32 carries only the engine-core intervals."""
    from vllm.v1.metrics.stats import IterationStats

    original = IterationStats.update_from_finished_request
    if getattr(original, _BUILD_APP_MARK, False):
        return True
    try:
        signature = inspect.signature(original)
        if "req_stats" not in signature.parameters:
            raise ValueError("no req_stats")
    except (TypeError, ValueError):
        _log.warning("infersight: IterationStats.update_from_finished_request changed; the engine TTFT is "
                     "taken from the engine-core intervals")
        return False

    @functools.wraps(original)
    def update_from_finished_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            req_stats = signature.bind(self, *args, **kwargs).arguments["req_stats"]
            finished = self.finished_requests[-1]
            setattr(finished, FIRST_TOKEN_LATENCY, float(req_stats.first_token_latency))
        except Exception:  # noqa: BLE001 - never break vLLM's output loop
            pass
        return result

    setattr(update_from_finished_request, _BUILD_APP_MARK, True)
    IterationStats.update_from_finished_request = update_from_finished_request
    return True

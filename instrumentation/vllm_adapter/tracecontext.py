"""Where a vLLM request's trace parent comes from.

- vLLM tracing on (``otlp_traces_endpoint`` set): vLLM ends one ``llm_request`` SERVER span per finished
  request, in the frontend process, just before the stat loggers see that request finish. A span
  processor on the global tracer provider remembers each such span's context by vLLM's
  ``gen_ai.request.id`` (the external request id, which is also ``FinishedRequestStats.request_id``);
  our stage spans become its children.
- vLLM tracing off: ``AsyncLLM.add_request`` drops the request's ``trace_headers`` (with a warning), so
  nothing downstream sees them. A thin wrapper on ``AsyncLLM.add_request`` (installed once, by the
  plugin) remembers the W3C headers by request id before vLLM drops them; our request span joins that
  trace.

Both maps are bounded (requests that never finish, e.g. rejected ones, cannot grow them without limit)
and entries are removed when the request finishes. Per request, not per token.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

_log = logging.getLogger(__name__)

LLM_REQUEST_SPAN = "llm_request"  # vllm/v1/engine/output_processor.py, do_tracing()
MAX_PENDING = 65_536


class _BoundedMap:
    def __init__(self, limit: int = MAX_PENDING) -> None:
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            if len(self._items) > self._limit:
                self._items.popitem(last=False)

    def pop(self, key: str) -> Any:
        with self._lock:
            return self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


class RequestParents:
    """Trace parents of in-flight vLLM requests, by external request id."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self.headers = _BoundedMap(limit)
        self.llm_request_spans = _BoundedMap(limit)

    def pop_headers(self, request_id: str | None) -> Mapping[str, str] | None:
        if not request_id:
            return None
        found = self.headers.pop(request_id)
        if found is None and "_" in request_id:  # parallel sampling: child ids are "<index>_<parent id>"
            found = self.headers.pop(request_id.split("_", 1)[1])
        return found

    def pop_llm_request(self, request_id: str | None) -> Any:
        return self.llm_request_spans.pop(request_id) if request_id else None


PARENTS = RequestParents()  # one per process: vLLM's AsyncLLM class is patched once per process


def _capture_processor(parents: RequestParents, request_id_attribute: str) -> Any:
    """A span processor remembering vLLM's ``llm_request`` span contexts by request id."""
    from opentelemetry.sdk.trace import SpanProcessor

    class LlmRequestCapture(SpanProcessor):
        def on_end(self, span: Any) -> None:
            if span.name != LLM_REQUEST_SPAN:
                return
            request_id = (span.attributes or {}).get(request_id_attribute)
            if request_id:
                parents.llm_request_spans.put(str(request_id), span.get_span_context())

    return LlmRequestCapture()


_capture_lock = threading.Lock()
_captured_providers: set[int] = set()


def attach_llm_request_capture(provider: Any, parents: RequestParents = PARENTS) -> bool:
    """Add the capture processor to an SDK tracer provider (once per provider); False if not an SDK one."""
    if not hasattr(provider, "add_span_processor"):
        return False
    from vllm.tracing import SpanAttributes

    with _capture_lock:
        if id(provider) in _captured_providers:
            return True
        provider.add_span_processor(_capture_processor(parents, SpanAttributes.GEN_AI_REQUEST_ID))
        _captured_providers.add(id(provider))
    return True


_PATCH_MARK = "__infersight_trace_headers__"


def install_header_capture(parents: RequestParents = PARENTS, edges: Any = None, capture_headers: bool = True
                           ) -> bool:
    """Wrap ``AsyncLLM.add_request`` once so requests' W3C trace headers are remembered by request id (unless
    ``capture_headers`` is False) and the HTTP request's edge timing is filed under it (``edges``, an
    ``edge.EdgeRegistry``)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.add_request
    if getattr(original, _PATCH_MARK, False):
        return True
    try:
        params = list(inspect.signature(original).parameters)
        position = params.index("trace_headers") - 1  # minus self
        id_position = params.index("request_id") - 1
    except (TypeError, ValueError):
        _log.warning("infersight: AsyncLLM.add_request has no trace_headers parameter in this vLLM version; "
                     "stage spans will start new traces unless vLLM tracing is on")
        return False

    @functools.wraps(original)
    async def add_request(self, *args, **kwargs):
        try:
            request_id = kwargs.get("request_id", args[id_position] if len(args) > id_position else None)
            if edges is not None:
                edges.file_current(request_id)
            headers = kwargs.get("trace_headers") if capture_headers else None
            if capture_headers and headers is None and len(args) > position:
                headers = args[position]
            if headers and isinstance(request_id, str):
                parents.headers.put(request_id, dict(headers))
        except Exception:  # noqa: BLE001 - never fail a request for telemetry
            pass
        return await original(self, *args, **kwargs)

    setattr(add_request, _PATCH_MARK, True)
    add_request.__infersight_original__ = original  # type: ignore[attr-defined]
    AsyncLLM.add_request = add_request
    return True


def uninstall_header_capture() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    original = getattr(AsyncLLM.add_request, "__infersight_original__", None)
    if original is not None:
        AsyncLLM.add_request = original

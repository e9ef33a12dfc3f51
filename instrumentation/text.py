"""Text both OTLP encoders (ours and the SDK's) can write: a ``str`` without lone surrogates.

Python strings may hold lone UTF-16 surrogates (``json.loads('"\\ud800"')`` makes one) that UTF-8 cannot
encode; a span name or status message holding one fails the whole export batch. Names and label values the
instrumentation is given are checked only where it already does extra work for a value (a series-cache miss, an
unknown stage name), so a well-formed request pays nothing for this.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def is_text(value: Any) -> bool:
    """Whether ``value`` is a ``str`` UTF-8 can encode (no lone surrogates)."""
    return isinstance(value, str) and (value.isascii() or _SURROGATE.search(value) is None)


def as_text(value: Any) -> str:
    """``value`` as such text: a string's lone surrogates become U+FFFD, anything else is ``str(value)`` (the
    same), and an empty result (or a ``__str__`` that raises) is ``"unknown"``. A non-empty string that already
    is such text comes back unchanged."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not reach serving code
        text = ""
    return _SURROGATE.sub(REPLACEMENT, text) or "unknown"

"""The gate every zero-code instrumentor passes before patching a library."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection

from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

_log = logging.getLogger(__name__)
_OFF = ("0", "false", "no", "off")


def may_instrument(env_enabled: str, instruments: Collection[str], library: str) -> bool:
    """False (with one log line) when ``env_enabled`` switches the instrumentor off, or when the installed
    ``library`` is outside ``instruments``: opentelemetry-instrument skips that version check
    (skip_dep_check), and an unsupported version is left alone rather than patched blindly. A library that
    is not installed at all (a vLLM pod has no tritonclient) is a DEBUG line: nothing to warn about."""
    if os.environ.get(env_enabled, "true").strip().lower() in _OFF:
        _log.info("infersight: %s=false, %s not instrumented", env_enabled, library)
        return False
    conflict = get_dependency_conflicts(list(instruments))
    if conflict is not None:
        absent = getattr(conflict, "found", "") is None and not getattr(conflict, "found_any", None)
        _log.log(logging.DEBUG if absent else logging.WARNING, "infersight: %s not instrumented: %s", library,
                 conflict)
        return False
    return True

"""OTLP metric name (+ unit, kind) -> the name Prometheus stores it under.

The sink collector's ``prometheusremotewrite`` exporter translates names with Prometheus's
``otlptranslator`` (suffixes added, names escaped to ``[a-zA-Z0-9:_]``); every query the project writes
(the live view, tests, dashboards, alert rules) derives its names here instead of typing them. Written
by hand because the translator is a Go library; ``tests/unit/test_prometheus_names.py`` checks the
rules, and the integration tests query the real Prometheus with the names it returns.
"""

from __future__ import annotations

import re

# UCUM unit -> Prometheus unit word, as otlptranslator maps them (unknown units pass through).
_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius",
    "Hz": "hertz", "1": "", "%": "percent",
}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_INVALID = re.compile(r"[^a-zA-Z0-9:]+")
KINDS = ("counter", "updowncounter", "gauge", "histogram")


def _unit_tokens(unit: str) -> tuple[str, str]:
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_word = "" if not main or "{" in main or "}" in main else _UNITS.get(main, main)
    per_word = "" if not per or "{" in per or "}" in per else _PER_UNITS.get(per, per)
    clean = lambda word: _INVALID.sub("_", word).strip("_")  # noqa: E731
    return clean(main_word), ("per_" + clean(per_word)) if per_word else ""


def prometheus_name(name: str, unit: str = "", kind: str = "gauge") -> str:
    """The Prometheus metric name of an OTLP metric (``kind``: one of ``KINDS``; a cumulative monotonic sum
    is a ``counter``). A histogram's series add ``_bucket``, ``_sum`` and ``_count`` to it.

    >>> prometheus_name("gen_ai.server.time_to_first_token", "s", "histogram")
    'gen_ai_server_time_to_first_token_seconds'
    >>> prometheus_name("infersight.requests", "{request}", "counter")
    'infersight_requests_total'
    """
    if kind not in KINDS:
        raise ValueError(f"metric kind {kind!r} is not one of {', '.join(KINDS)}")
    tokens = [t for t in _INVALID.split(name) if t]
    main, per = _unit_tokens(unit)
    if main and main not in tokens:
        tokens.append(main)
    if per and per not in tokens:
        tokens.append(per)
    if kind == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    if not out:
        raise ValueError(f"metric name {name!r} has no character Prometheus allows")
    return "_" + out if out[0].isdigit() else out

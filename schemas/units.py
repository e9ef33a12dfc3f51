"""Unit constants shared by every component: integer nanoseconds per second and per millisecond.

Times travel as integer nanoseconds (OTLP's ``*_unix_nano``); durations in records are float seconds."""

from __future__ import annotations

NS = 1_000_000_000  # nanoseconds per second
MS = 1_000_000      # nanoseconds per millisecond

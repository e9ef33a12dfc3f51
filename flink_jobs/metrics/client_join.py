"""The client TTFT join (issue #22), pure: the client and server halves of one trace
(``schemas/client_calls.py``) -> one joined call with the client's TTFT and the server record's region and
model; running totals per (region, model) -> OTLP histograms; unmatched client calls counted per model.

Matching, within one trace: a client half and a server half match as soon as both are there when the server
span's parent is the client span (what the OpenAI client instrumentation and the vLLM plugin produce: the
client's ``traceparent`` makes the server's request span its child). A half waits for its other half at most
``timeout_ms`` (processing time, from arrival); then, as a fallback for a span between the two (a proxy), it
joins a waiting half of the other side by time: the server request within the client call, give or take
``tolerance_ns`` of clock skew between the hosts, the nearest start first. A client half still alone is
*unmatched* (counted, never published under a region), a server half is dropped (counted: most called
requests have no instrumented client). At most ``MAX_PENDING`` halves
of a side wait per trace: the oldest beyond that is expired at once. So keyed state stays bounded by
(halves per second x timeout), whatever arrives.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import ceil, log2
from typing import Any

from infersight.flink_jobs.common.deadletter import dead_letter, json_of
from infersight.flink_jobs.common.keys import join_fields, split_fields
from infersight.flink_jobs.metrics.otlp_metrics import MetricsBatch
from infersight.schemas import client_calls as C
from infersight.schemas import pipeline as P
from infersight.schemas.metrics import TTFT_BUCKETS
from infersight.schemas.records import parse_batch
from infersight.schemas.topics import CLIENT_CALLS

JOB = "infersight-metrics"
MAX_PENDING = 64  # halves of one side waiting in one trace
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_TOLERANCE_S = 0.5
_INDEX_FACTOR = 2.0 ** P.EXPONENTIAL_SCALE


def read_halves(value: str | bytes, letters: list[str], topic: str = CLIENT_CALLS.name) -> list[dict[str, Any]]:
    """The valid halves of one ``infersight.client_calls`` message; a dead letter in ``letters`` for the message
    when it is not a JSON batch, and for each item that breaks the contract."""
    try:
        items = parse_batch(value)
    except Exception as exc:  # noqa: BLE001 - orjson's JSONDecodeError, or a str that is not UTF-8
        letters.append(dead_letter(JOB, f"payload: not a JSON batch ({type(exc).__name__}: {exc})", value,
                                   topic=topic))
        return []
    out = []
    for item in items:
        problems = C.problems(item)
        if problems:
            trace_id = item.get("trace_id") if isinstance(item, dict) else None
            letters.append(dead_letter(JOB, "; ".join(problems), json_of(item), problems=problems, topic=topic,
                                       trace_id=trace_id if isinstance(trace_id, str) else None))
        else:
            out.append(item)
    return out


@dataclass(frozen=True, slots=True)
class Joined:
    """One client call joined with its server request: published under the server's region and model."""

    region: str
    model: str
    client_ttft_s: float
    server_ttft_s: float | None  # the record's TTFT (the edge TTFT with the vLLM plugin)

    @property
    def outside_server_s(self) -> float | None:
        """Client TTFT - the server's: the network both ways and everything before the app."""
        return None if self.server_ttft_s is None else self.client_ttft_s - self.server_ttft_s


@dataclass(slots=True)
class Pending:
    """One trace's halves waiting for their other half, each with its arrival (processing time, ms)."""

    clients: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    servers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.clients or self.servers)

    def deadline(self, timeout_ms: int) -> int | None:
        """When the oldest half waiting expires (None: none waits)."""
        arrivals = [t for t, _ in self.clients] + [t for t, _ in self.servers]
        return min(arrivals) + timeout_ms if arrivals else None


@dataclass(slots=True)
class Outcome:
    """What one step of the join produced."""

    joined: list[Joined] = field(default_factory=list)
    unmatched_clients: list[dict[str, Any]] = field(default_factory=list)
    dropped_servers: int = 0


def _matches(client: dict[str, Any], server: dict[str, Any], tolerance_ns: int) -> bool:
    return (server["start_ns"] >= client["start_ns"] - tolerance_ns
            and server["end_ns"] <= client["end_ns"] + tolerance_ns)


def _by_parent(half: dict[str, Any], others: list[tuple[int, dict[str, Any]]], half_is_client: bool) -> int | None:
    """The index in ``others`` (the other side's waiting halves) of the half linked to ``half`` by parent."""
    for i, (_t, other) in enumerate(others):
        if (other["parent_span_id"] == half["span_id"] if half_is_client
                else other["span_id"] == half["parent_span_id"]):
            return i
    return None


def _by_time(half: dict[str, Any], others: list[tuple[int, dict[str, Any]]], half_is_client: bool,
             tolerance_ns: int) -> int | None:
    """The index in ``others`` of the half ``half`` lies around (a client) or within (a server), the nearest start."""
    best, best_gap = None, None
    for i, (_t, other) in enumerate(others):
        client, server = (half, other) if half_is_client else (other, half)
        if _matches(client, server, tolerance_ns):
            gap = abs(server["start_ns"] - client["start_ns"])
            if best_gap is None or gap < best_gap:
                best, best_gap = i, gap
    return best


def _joined(client: dict[str, Any], server: dict[str, Any]) -> Joined:
    return Joined(server["region"], server["model"], client["ttft_s"], server["ttft_s"])


def add(pending: Pending | None, half: dict[str, Any], now_ms: int) -> tuple[Pending, Outcome]:
    """One (valid) half of a trace arrives: joined with the waiting other half it is linked to by parent, or
    waits itself (for that half, or for ``expire``'s match by time)."""
    pending = pending or Pending()
    outcome = Outcome()
    is_client = half["side"] == C.CLIENT
    others = pending.servers if is_client else pending.clients
    i = _by_parent(half, others, is_client)
    if i is not None:
        _t, other = others.pop(i)
        outcome.joined.append(_joined(half, other) if is_client else _joined(other, half))
        return pending, outcome
    mine = pending.clients if is_client else pending.servers
    mine.append((now_ms, half))
    if len(mine) > MAX_PENDING:  # bounded per trace: the oldest goes, counted
        _t, oldest = mine.pop(0)
        if is_client:
            outcome.unmatched_clients.append(oldest)
        else:
            outcome.dropped_servers += 1
    return pending, outcome


def expire(pending: Pending | None, now_ms: int, timeout_ms: int,
           tolerance_ns: int = int(DEFAULT_TOLERANCE_S * 1e9)) -> tuple[Pending, Outcome]:
    """The halves that waited ``timeout_ms`` or more: each joined by time with a waiting half of the other side
    (no half linked by parent came), else gone: a client as unmatched, a server dropped. Matching by time only
    here, at the end of the wait, keeps it from taking a half whose own linked half was still on its way."""
    pending = pending or Pending()
    outcome = Outcome()
    for is_client in (True, False):
        mine = pending.clients if is_client else pending.servers
        others = pending.servers if is_client else pending.clients
        keep = []
        for arrived, half in mine:
            if now_ms - arrived < timeout_ms:
                keep.append((arrived, half))
                continue
            i = _by_time(half, others, is_client, tolerance_ns)
            if i is not None:
                _t, other = others.pop(i)
                outcome.joined.append(_joined(half, other) if is_client else _joined(other, half))
            elif is_client:
                outcome.unmatched_clients.append(half)
            else:
                outcome.dropped_servers += 1
        mine[:] = keep
    return pending, outcome


# ---- publishing: running totals per key -> OTLP ----

JOINED, UNMATCHED = "joined", "unmatched"


def joined_key(j: Joined) -> str:
    return join_fields((JOINED, j.region, j.model))


def unmatched_key(client: dict[str, Any]) -> str:
    return join_fields((UNMATCHED, client["model"]))


class Histogram:
    """A cumulative distribution: explicit bucket counts (``bounds``, OTLP's (lower, upper]), exponential buckets
    at ``P.EXPONENTIAL_SCALE``, sum and count; no sketch (it is never windowed)."""

    __slots__ = ("bounds", "counts", "exp", "zero", "total", "n")

    def __init__(self, bounds: tuple[float, ...] = TTFT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.exp: dict[int, int] = {}
        self.zero = 0
        self.total = 0.0
        self.n = 0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        if value > 0.0:
            i = ceil(log2(value) * _INDEX_FACTOR) - 1
            self.exp[i] = self.exp.get(i, 0) + 1
        else:
            self.zero += 1
        self.total += value
        self.n += 1

    def exponential_buckets(self) -> tuple[int, list[int]]:
        if not self.exp:
            return 0, []
        lo, hi = min(self.exp), max(self.exp)
        return lo, [self.exp.get(i, 0) for i in range(lo, hi + 1)]


@dataclass(slots=True)
class Totals:
    """One key's running totals since ``start_ns``: client TTFT and outside-server histograms (joined), or a
    count (unmatched)."""

    start_ns: int
    last_ns: int = 0  # the stamp of the last batch sent (Prometheus takes a series' samples in time order)
    ttft: Histogram = field(default_factory=Histogram)
    outside: Histogram = field(default_factory=Histogram)
    unmatched: int = 0

    def add(self, value: Any) -> Totals:
        if isinstance(value, Joined):
            self.ttft.add(value.client_ttft_s)
            if value.outside_server_s is not None:
                self.outside.add(value.outside_server_s)
        else:
            self.unmatched += 1
        return self


def _histograms(batch: MetricsBatch, name: str, labels: dict[str, str], h: Histogram, t0: int, t: int) -> None:
    batch.histogram(name, "s", labels, h.bounds, h.counts, h.total, t0, t)
    offset, counts = h.exponential_buckets()
    batch.exponential_histogram(name, "s", labels, P.EXPONENTIAL_SCALE, h.zero, offset, counts, h.total, t0, t)


def encode(key: str, totals: Totals, time_ns: int) -> bytes:
    """One key's totals as an OTLP batch stamped ``time_ns``."""
    fields = split_fields(key)
    batch = MetricsBatch(JOB)
    if fields[0] == JOINED:
        labels = {P.LABEL_REGION: fields[1], P.LABEL_MODEL: fields[2]}
        if totals.ttft.n:
            _histograms(batch, P.CLIENT_TTFT, labels, totals.ttft, totals.start_ns, time_ns)
        if totals.outside.n:
            _histograms(batch, P.CLIENT_OUTSIDE_SERVER, labels, totals.outside, totals.start_ns, time_ns)
    else:
        batch.counter(P.CLIENT_UNMATCHED, "{call}", {P.LABEL_MODEL: fields[1]}, totals.unmatched, totals.start_ns,
                      time_ns)
    return batch.serialize()


def publish_items(outcome: Outcome) -> Iterable[tuple[str, Any]]:
    """``(key, Joined | unmatched client)`` for the totals operator."""
    for j in outcome.joined:
        yield joined_key(j), j
    for client in outcome.unmatched_clients:
        yield unmatched_key(client), client

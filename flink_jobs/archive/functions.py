"""The archive job's Flink functions. They live in their own module so Flink pickles them by reference: the
job module runs as ``__main__`` under ``flink run``."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction
from pyflink.datastream.functions import FlatMapFunction, RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from infersight.flink_jobs.archive import core
from infersight.flink_jobs.common.deadletter import dead_letter, json_of
from infersight.flink_jobs.common.keys import split_timed_key, timed_key
from infersight.schemas.records import parse_batch, record_problems
from infersight.schemas.topics import REQUESTS
from infersight.schemas.units import MS


class ParseRecord(FlatMapFunction):
    """A batch of JSON records -> one ``(bucket key, latest end ms, Arrow IPC table)`` per region and bucket
    in it, and ``(None, 0, DLQ record)`` for what it cannot parse or validate (a batch that is not JSON, an
    item off the contract, a row Arrow refuses): dead-lettered, never a crash loop (``job`` routes them to
    ``infersight.dlq``). Rows become Arrow here, as they arrive, not at the bucket's
    flush: converting a minute of rows at once stalled the machine for seconds every minute (and with it
    the metrics' freshness). The tables travel and wait in state zstd-compressed (~650 -> ~140 bytes a
    row): a minute of rows at thousands a second as JSON text or pickled dicts ran the task manager's heap
    out of memory."""

    def __init__(self, bucket_ms: int) -> None:
        self.bucket_ms = core.check_bucket_ms(bucket_ms)

    def flat_map(self, value: str):
        try:
            records = parse_batch(value)
        except Exception as exc:  # noqa: BLE001 - bad input must never stop the job
            yield None, 0, dead_letter(core.JOB, f"payload: not a JSON batch ({type(exc).__name__}: {exc})",
                                       value, topic=REQUESTS.name)
            return
        groups: dict[str, tuple[int, list]] = {}
        for record in records:
            problems = record_problems(record)
            if problems:
                yield None, 0, _letter(record, problems)
                continue
            end_ns, region = record["end_ns"], record["region"]
            key = timed_key(region, core.bucket_of(end_ns, self.bucket_ms))
            last, rows = groups.get(key, (0, []))
            rows.append(record)
            groups[key] = (max(last, end_ns // MS), rows)
        for key, (last_ms, rows) in groups.items():
            table, refused = _table_of(rows)
            for row, problem in refused:
                yield None, 0, _letter(row, [problem])
            if table.num_rows:
                yield key, last_ms, core.to_ipc(table)


def _letter(record: Any, problems: list[str]) -> str:
    trace_id = record.get("trace_id") if isinstance(record, dict) else None
    return dead_letter(core.JOB, "; ".join(problems), json_of(record), problems=problems, topic=REQUESTS.name,
                       trace_id=trace_id if isinstance(trace_id, str) else None)


def _table_of(rows: list[dict]) -> tuple[pa.Table, list[tuple[dict, str]]]:
    """The rows as a table, and the rows that do not fit the schema with why (validated rows should all fit)."""
    try:
        return core.table_of(rows), []
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        good, refused = [], []
        for row in rows:
            try:
                core.table_of([row])
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                refused.append((row, f"record: does not fit the archive's schema ({type(exc).__name__}: {exc})"))
            else:
                good.append(row)
        return core.table_of(good), refused


def is_batch(t: Any) -> bool:
    return t[0] is not None


def is_dead_letter(t: Any) -> bool:
    return t[0] is None


def third(t: Any) -> Any:
    return t[2]


def first(t: Any) -> Any:
    return t[0]


class ArchiveBuckets(KeyedProcessFunction):
    """Per (region, bucket): buffer rows in state; at bucket end + grace write them all to one file.

    ``meta`` = ``(files flushed, run id)``. Rows after a flush go to the next seq on a later timer. The
    first flush of a key in a new run (after a restore) deletes the key's files at or past the restored
    seq: those were written after the checkpoint, and their rows come back in the replay.
    """

    def __init__(self, root: str, bucket_ms: int, grace_ms: int) -> None:
        self.root, self.bucket_ms, self.grace_ms = root, bucket_ms, grace_ms

    def open(self, runtime_context: RuntimeContext) -> None:
        # Pickled bytes: with PRIMITIVE_ARRAY(BYTE) as this state's and the batches' type, every checkpoint of
        # this operator failed to materialise in thread mode (which of the two was not isolated).
        self.rows = runtime_context.get_list_state(ListStateDescriptor("batches", Types.PICKLED_BYTE_ARRAY()))
        self.meta = runtime_context.get_state(ValueStateDescriptor("meta", Types.PICKLED_BYTE_ARRAY()))
        self.run = uuid.uuid4().hex  # not checkpointed: tells this run's flushes from restored ones

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        self.rows.add(value[2])  # one state entry per batch: its Arrow IPC bytes
        _, bucket = split_timed_key(ctx.get_current_key())
        due = bucket + self.bucket_ms + self.grace_ms
        # A late row's bucket timer already fired: ask for the next watermark (same-time timers are deduplicated).
        ctx.timer_service().register_event_time_timer(max(due, ctx.timer_service().current_watermark() + 1))

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        table = core.from_ipc(self.rows.get() or ())
        rows = table.num_rows
        if not rows:  # an earlier timer of this key already flushed them
            return
        region, bucket = split_timed_key(ctx.get_current_key())
        seq, run = self.meta.value() or (0, None)
        if run != self.run:
            core.remove_from_seq(self.root, region, bucket, seq)
        path = core.write_bucket(self.root, region, bucket, seq, table)
        self.meta.update((seq + 1, self.run))
        self.rows.clear()
        yield f"{path} {rows}"

"""The archive's pure part: Parquet schema, bucketing, Hive paths and idempotent bucket writes (no PyFlink).

Layout: ``<root>/day=YYYY-MM-DD/region=<region>/part-<bucket_start_ms>-<seq>.parquet``. A file's name is a
function of (region, bucket, seq) and its bytes a function of its rows (sorted), so writing it again after a
replay replaces it with the same file instead of adding a copy.
"""

from __future__ import annotations

import os
import typing
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from infersight.flink_jobs.common.windows import window_start_ms
from infersight.schemas.records import RECORD_FIELDS, RequestRecord
from infersight.schemas.units import MS, NS

JOB = "infersight-archive"

DAY_MS = 86_400_000
_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64()}


def _arrow_type(hint: Any) -> pa.DataType:
    base = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]  # "float | None" -> float
    return _ARROW[base[0]]


# Every column nullable: optional fields stay null instead of becoming 0 / "".
SCHEMA = pa.schema([pa.field(name, _arrow_type(typing.get_type_hints(RequestRecord)[name]), nullable=True)
                    for name in RECORD_FIELDS])


def check_bucket_ms(bucket_ms: int) -> int:
    """Buckets must tile the UTC day, so a bucket (one file) never straddles two ``day=`` partitions."""
    if bucket_ms <= 0 or DAY_MS % bucket_ms:
        raise ValueError(f"bucket of {bucket_ms} ms does not divide a day evenly")
    return bucket_ms


def bucket_of(end_ns: int, bucket_ms: int) -> int:
    """Start (epoch ms) of the event-time bucket holding a record that ended at ``end_ns``."""
    return window_start_ms(end_ns // MS, bucket_ms)


def partition_path(root: str | os.PathLike[str], region: str, end_ns: int) -> Path:
    day = datetime.fromtimestamp(end_ns // NS, UTC).strftime("%Y-%m-%d")
    # pyarrow's hive partitioning URI-decodes segments, so encode to survive "/" or "=" in a region.
    return Path(root) / f"day={day}" / f"region={quote(region, safe='')}"


def file_name(bucket_start_ms: int, seq: int) -> str:
    return f"part-{bucket_start_ms}-{seq}.parquet"


# trace_id, span_id first (a repeated request's copies become neighbours); every other column breaks ties,
# so even repeated ids have one order. Sorting in Arrow: a per-row Python sort key cost ~20 us a row.
_SORT_KEYS = [(name, "ascending") for name in
              ("trace_id", "span_id", *(f for f in RECORD_FIELDS if f not in ("trace_id", "span_id")))]


def table_of(records: list[dict[str, Any]]) -> pa.Table:
    """Records (dicts of the contract) as an Arrow table of the archive's schema; missing fields are null."""
    return pa.Table.from_pylist(records, schema=SCHEMA)


_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def to_ipc(table: pa.Table) -> bytes:
    """A table as Arrow IPC stream bytes with zstd-compressed buffers (~140 bytes a row)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(blobs: typing.Iterable[bytes]) -> pa.Table:
    """The tables of ``to_ipc`` blobs as one table (empty, of the archive's schema, for none)."""
    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs]
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def unique_sorted(table: pa.Table) -> pa.Table:
    """Rows sorted; a request delivered twice upstream (same trace and span id: see
    ``schemas.records.unique_requests``) kept once. Rows without a span id are all kept."""
    table = table.sort_by(_SORT_KEYS)
    if table.num_rows < 2:
        return table
    trace, span = table.column("trace_id"), table.column("span_id")
    # row i repeats row i-1: same ids, and a span id to go by (null/"" never match: each row kept)
    same = pc.and_(pc.equal(trace[1:], trace[:-1]), pc.equal(span[1:], span[:-1]))
    repeated = pc.and_(same, pc.greater(pc.utf8_length(span[1:]), 0))
    if not pc.any(repeated).as_py():
        return table
    keep = pa.concat_arrays([pa.array([True]), pc.invert(pc.fill_null(repeated, False)).combine_chunks()])
    return table.filter(keep)


def write_bucket(root: str | os.PathLike[str], region: str, bucket_start_ms: int, seq: int,
                 rows: list[dict[str, Any]] | pa.Table) -> Path:
    """Write one bucket's rows atomically to its deterministic file (replacing any previous copy)."""
    folder = partition_path(root, region, bucket_start_ms * MS)
    folder.mkdir(parents=True, exist_ok=True)
    table = unique_sorted(rows if isinstance(rows, pa.Table) else table_of(rows))
    final = folder / file_name(bucket_start_ms, seq)
    # A dot-prefixed temp file in the same folder: readers skip it and os.replace is atomic there.
    tmp = folder / f".{final.name}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def remove_from_seq(root: str | os.PathLike[str], region: str, bucket_start_ms: int, seq: int) -> list[Path]:
    """Delete a bucket's files numbered ``seq`` or more (and stray temp files); returns what was removed.

    After a restore these were written past the checkpoint, so their rows will all be replayed, though
    perhaps grouped differently (watermark timing is not deterministic); keeping them could duplicate rows.
    """
    folder = partition_path(root, region, bucket_start_ms * MS)
    prefix = f"part-{bucket_start_ms}-"
    removed = []
    for path in folder.glob(f"*{prefix}*") if folder.is_dir() else ():
        name = path.name
        stale_tmp = name.startswith(f".{prefix}") and name.endswith(".tmp")
        number = name[len(prefix):-len(".parquet")] if name.startswith(prefix) and name.endswith(".parquet") else ""
        if stale_tmp or (number.isdigit() and int(number) >= seq):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def read_archive(root: str | os.PathLike[str]) -> pa.Table:
    """Every archived row: the record columns plus the ``day`` partition column."""
    if not Path(root).is_dir() or not (dataset := ds.dataset(str(root), format="parquet", partitioning="hive")).files:
        return SCHEMA.append(pa.field("day", pa.string())).empty_table()  # nothing archived yet
    return dataset.to_table(columns=[*RECORD_FIELDS, "day"])

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
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from infersight.schemas.records import RECORD_FIELDS, RequestRecord, unique_requests

MS = 1_000_000  # ns per ms
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
    ms = end_ns // MS
    return ms - ms % bucket_ms


def partition_path(root: str | os.PathLike[str], region: str, end_ns: int) -> Path:
    day = datetime.fromtimestamp(end_ns // 1_000_000_000, UTC).strftime("%Y-%m-%d")
    # pyarrow's hive partitioning URI-decodes segments, so encode to survive "/" or "=" in a region.
    return Path(root) / f"day={day}" / f"region={quote(region, safe='')}"


def file_name(bucket_start_ms: int, seq: int) -> str:
    return f"part-{bucket_start_ms}-{seq}.parquet"


# trace_id first; every other column breaks ties, so even repeated trace ids have one order. Sorting in
# Arrow: a per-row Python sort key (the full row as JSON) cost ~20 us a row, more than the rest of a write.
_SORT_KEYS = [(name, "ascending") for name in ("trace_id", *(f for f in RECORD_FIELDS if f != "trace_id"))]


def write_bucket(root: str | os.PathLike[str], region: str, bucket_start_ms: int, seq: int,
                 records: list[dict[str, Any]]) -> Path:
    """Write one bucket's rows atomically to its deterministic file (replacing any previous copy)."""
    folder = partition_path(root, region, bucket_start_ms * MS)
    folder.mkdir(parents=True, exist_ok=True)
    rows = list(unique_requests(records))  # a request repeated upstream: once
    table = pa.Table.from_pylist(rows, schema=SCHEMA).sort_by(_SORT_KEYS)
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

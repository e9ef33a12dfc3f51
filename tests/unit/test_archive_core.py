"""The archive's pure core: Hive layout by UTC day and region, idempotent bucket writes, nulls kept."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime

import pyarrow.dataset as ds
import pytest

from infersight.flink_jobs.archive import core
from infersight.schemas.records import RECORD_FIELDS
from tests.support.sample_requests import sample_records

BUCKET_MS = 60_000
MIDNIGHT_NS = int(datetime(2024, 3, 1, tzinfo=UTC).timestamp()) * 1_000_000_000


def two_days_two_regions() -> list[dict]:
    # 2 minutes either side of midnight UTC, so rows fall on 2024-02-29 and 2024-03-01.
    records = [r.to_dict() for r in sample_records(400, MIDNIGHT_NS - 120 * 10**9, 240.0, seed=3,
                                                   regions=("us-east-1", "eu-west-1"))]
    assert {r["end_ns"] < MIDNIGHT_NS for r in records} == {True, False}
    return records


def write_all(root, records: list[dict], seq: int = 0) -> list:
    buckets: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in records:
        buckets[r["region"], core.bucket_of(r["end_ns"], BUCKET_MS)].append(r)
    return [core.write_bucket(root, region, bucket, seq, rows) for (region, bucket), rows in buckets.items()]


def test_partitions_by_day_and_region(tmp_path):
    records = two_days_two_regions()
    paths = write_all(tmp_path, records)
    folders = {p.parent.relative_to(tmp_path).as_posix() for p in paths}
    assert folders == {f"day={d}/region={r}" for d in ("2024-02-29", "2024-03-01") for r in ("us-east-1", "eu-west-1")}
    for p in paths:  # the file name is the bucket and seq
        assert p.name.startswith("part-") and p.name.endswith("-0.parquet")

    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == len(records)
    for row in table.select(["end_ns", "region", "day"]).to_pylist():
        assert row["day"] == datetime.fromtimestamp(row["end_ns"] // 10**9, UTC).strftime("%Y-%m-%d")
    assert sorted(core.read_archive(tmp_path)["trace_id"].to_pylist()) == sorted(r["trace_id"] for r in records)


def test_rows_sorted_by_trace_id(tmp_path):
    records = two_days_two_regions()
    for p in write_all(tmp_path, records):
        ids = ds.dataset(p, format="parquet").to_table()["trace_id"].to_pylist()
        assert ids == sorted(ids)


def test_rewriting_a_bucket_is_idempotent(tmp_path):
    records = two_days_two_regions()
    first = {p: p.read_bytes() for p in write_all(tmp_path, records)}
    # A replay delivers the same rows in another order: same names, same bytes, no extra files.
    second = write_all(tmp_path, list(reversed(records)))
    assert set(second) == set(first)
    assert all(p.read_bytes() == first[p] for p in second)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(first)
    table = core.read_archive(tmp_path)
    assert table.num_rows == len(records) == len(set(table["trace_id"].to_pylist()))


def test_remove_from_seq_keeps_earlier_files(tmp_path):
    rows = [r.to_dict() for r in sample_records(5, MIDNIGHT_NS, 1.0, seed=1, regions=("us-east-1",))]
    bucket = core.bucket_of(MIDNIGHT_NS, BUCKET_MS)
    paths = [core.write_bucket(tmp_path, "us-east-1", bucket, seq, rows[seq:seq + 2]) for seq in range(3)]
    (paths[0].parent / f".{paths[0].name}.dead.tmp").write_bytes(b"half")  # a crashed write
    removed = core.remove_from_seq(tmp_path, "us-east-1", bucket, 1)
    assert len(removed) == 3 and sorted(p.name for p in paths[0].parent.iterdir()) == [paths[0].name]


def test_nulls_are_preserved(tmp_path):
    record = next(sample_records(1, MIDNIGHT_NS, 1.0, seed=5)).to_dict()
    record.update(ttft_s=None, itl_p99_s=None, finish_reason=None, error_type=None)
    core.write_bucket(tmp_path, record["region"], core.bucket_of(record["end_ns"], BUCKET_MS), 0, [record])
    row = core.read_archive(tmp_path).to_pylist()[0]
    assert {k: row[k] for k in RECORD_FIELDS} == record
    assert core.SCHEMA.field("ttft_s").type == "double" and core.SCHEMA.field("end_ns").type == "int64"


def test_partition_path_and_bucket_checks(tmp_path):
    assert core.bucket_of(MIDNIGHT_NS + 61_500_000_000, BUCKET_MS) == MIDNIGHT_NS // 10**6 + 60_000
    assert core.partition_path(tmp_path, "a/b", MIDNIGHT_NS - 1).name == "region=a%2Fb"
    assert core.read_archive(tmp_path / "missing").num_rows == 0
    with pytest.raises(ValueError):
        core.check_bucket_ms(7_000)


def test_a_request_delivered_twice_is_archived_once(tmp_path):
    records = two_days_two_regions()
    write_all(tmp_path, records + [dict(r) for r in records[::4]])
    ids = core.read_archive(tmp_path).select(["trace_id", "span_id"]).to_pylist()
    assert len(ids) == len(records) and len({(r["trace_id"], r["span_id"]) for r in ids}) == len(records)


def test_parse_record_makes_one_arrow_table_per_region_and_bucket():
    from infersight.flink_jobs.archive.functions import ParseRecord
    from infersight.flink_jobs.common.keys import split_timed_key as split_key
    from infersight.schemas.records import dump_batch
    from infersight.schemas.units import MS

    parse = ParseRecord(BUCKET_MS)
    records = two_days_two_regions()
    one_key = [r for r in records if r["region"] == "us-east-1"
               and core.bucket_of(r["end_ns"], BUCKET_MS) == core.bucket_of(records[0]["end_ns"], BUCKET_MS)]
    [(key, last_ms, batch)] = parse.flat_map(dump_batch(one_key))
    assert core.from_ipc([batch]).to_pylist() == core.table_of(one_key).to_pylist()
    assert last_ms == max(r["end_ns"] for r in one_key) // MS
    assert split_key(key) == ("us-east-1", core.bucket_of(one_key[0]["end_ns"], BUCKET_MS))

    bad_type = {**records[0], "trace_id": "f" * 32, "tokens_in": "many"}  # off the contract: a dead letter
    out = list(parse.flat_map(dump_batch([*records, {"region": "us-east-1"}, bad_type])))  # + one without end_ns
    letters = [json.loads(t[2]) for t in out if t[0] is None]
    out = [t for t in out if t[0] is not None]
    assert [letter["reason"].split(":")[0] for letter in letters] == ["trace_id", "tokens_in"]
    assert {letter["job"] for letter in letters} == {"infersight-archive"}
    assert all(letter["source"]["topic"] == "infersight.requests" for letter in letters)
    assert len(out) == len({(r["region"], core.bucket_of(r["end_ns"], BUCKET_MS)) for r in records}) > 1
    back = core.from_ipc(batch for _key, _last, batch in out)
    assert sorted(back.column("trace_id").to_pylist()) == sorted(r["trace_id"] for r in records)
    for key, _last, batch in out:
        region, bucket = split_key(key)
        assert all(r["region"] == region and core.bucket_of(r["end_ns"], BUCKET_MS) == bucket
                   for r in core.from_ipc([batch]).to_pylist())
    [(none, _, letter)] = parse.flat_map("not json")
    assert none is None and json.loads(letter)["reason"].startswith("payload: not a JSON batch")


def test_unique_sorted_drops_repeated_ids_across_chunks_and_keeps_rows_without_a_span_id():
    records = two_days_two_regions()[:20]
    no_span = {**records[0], "trace_id": "a" * 32, "span_id": ""}
    chunks = [core.table_of(records[:10] + [no_span]), core.table_of(records[5:] + [no_span])]
    table = core.unique_sorted(core.from_ipc(core.to_ipc(t) for t in chunks))
    rows = table.select(["trace_id", "span_id"]).to_pylist()
    assert len(rows) == len(records) + 2 and rows.count({"trace_id": "a" * 32, "span_id": ""}) == 2
    assert rows == sorted(rows, key=lambda r: (r["trace_id"], r["span_id"]))
    assert core.unique_sorted(core.table_of(records)).num_rows == len(records)

"""archive: request records on ``infersight.requests`` -> Parquet, Hive-partitioned by UTC day and region.

Files: ``<root>/day=YYYY-MM-DD/region=<region>/part-<bucket_start_ms>-<seq>.parquet``; read them with
``pyarrow.dataset.dataset(root, format="parquet", partitioning="hive")`` (or ``core.read_archive``).

Exactly-once by idempotence (PyFlink gives Python functions no checkpoint hooks, so no two-phase commit):
records are keyed by (region, event-time bucket) and buffered in keyed state (as Arrow tables,
zstd-compressed); an event-time timer at bucket end + grace writes all of a bucket's rows, sorted by
trace_id, to a name fixed by (region, bucket, seq) via temp file + atomic rename, then clears them. Kafka
offsets, buffered rows, timers and seq are checkpointed together, so after a crash the job restores the last
checkpoint and replays from its offsets: every row of a file written since then is either in restored state
or replayed, and is written again to the same name. Because watermark timing (hence which rows count as
late, and how late rows group into seq files) can differ on replay, a key's first flush after a restore also
deletes its files at or past the restored seq. Consequences: a file may briefly miss rows during recovery,
never holds a duplicate. Restart from a checkpoint or savepoint; a fresh start (no state) must use a fresh
root, as committed offsets alone cannot say which files are already complete. Rows land about bucket +
out-of-orderness + grace after they end; watermarks advance only with new data (idle partitions are skipped
after ``--idle-s``).

    python -m infersight.flink_jobs.archive.job --brokers HOST:PORT --root FOLDER --jars URL;URL
"""

from __future__ import annotations

import argparse

from infersight.flink_jobs.archive.core import JOB
from infersight.schemas.topics import DLQ, REQUESTS


def build(env, brokers: str, group_id: str, root: str, bucket_s: float, out_of_orderness_s: float,
          idle_s: float, grace_s: float = 5.0, exactly_once: bool = True, quiet_s: float = 60.0,
          start_ms: int | None = None) -> None:
    from pyflink.common import Types

    from infersight.flink_jobs.archive import core
    from infersight.flink_jobs.archive import functions as F
    from infersight.flink_jobs.common.kafka_io import event_time, kafka_sink, kafka_source

    bucket_ms = core.check_bucket_ms(int(bucket_s * 1000))

    # (bucket key, latest end ms, Arrow IPC bytes), pickled: a tuple of a few objects, cheap
    batches = Types.PICKLED_BYTE_ARRAY()
    # Kafka record timestamps are the requests' end times (normalize writes them): per-partition
    # watermarks in the JVM source.
    parsed = (env.from_source(kafka_source(brokers, REQUESTS.name, group_id, start_ms=start_ms),
                              event_time(out_of_orderness_s, idle_s, quiet_s), "requests")
              .flat_map(F.ParseRecord(bucket_ms), output_type=batches).name("parse-requests"))
    # what cannot be parsed or validated: dead letters, never a crash loop
    (parsed.filter(F.is_dead_letter).map(F.third, output_type=Types.STRING()).name("dead-letters")
     .sink_to(kafka_sink(brokers, DLQ.name, group_id, exactly_once=exactly_once)).name(DLQ.name))
    (parsed.filter(F.is_batch)
     .key_by(F.first, key_type=Types.STRING())
     .process(F.ArchiveBuckets(root, bucket_ms, int(grace_s * 1000)), output_type=Types.STRING())
     .name("archive-buckets")
     .print().name("archived-files"))  # "<path> <rows>" per file, in the task managers' stdout


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment
    from infersight.flink_jobs.common.kafka_io import add_quiet_option, add_start_option

    parser = argparse.ArgumentParser(prog="archive", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--root", required=True, help="archive folder, on storage every task manager shares")
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--bucket-s", type=float, default=60.0, help="event-time bucket (must divide a day)")
    parser.add_argument("--out-of-orderness-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=30.0,
                        help="a source partition silent this long is idle (keep it above the checkpoint interval: "
                             "read_committed readers get each transaction's records at once, at checkpoints)")
    parser.add_argument("--grace-s", type=float, default=5.0, help="wait past bucket end before writing it")
    add_quiet_option(parser)
    add_start_option(parser)
    add_jars_option(parser)
    args = parser.parse_args(argv)
    env = execution_environment(args.jars)
    build(env, args.brokers, args.group_id, args.root, args.bucket_s, args.out_of_orderness_s, args.idle_s,
          args.grace_s, quiet_s=args.quiet_s, start_ms=args.start_ms)
    env.execute(JOB)


if __name__ == "__main__":
    main()

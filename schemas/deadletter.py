"""The dead-letter record: what every job writes to ``infersight.dlq`` for input it cannot parse or validate.

One JSON object per Kafka message (``flink_jobs/common/deadletter.py: dead_letter`` builds it; every job uses
that builder):

| field | type | meaning |
|---|---|---|
| ``reason`` | string | why, starting with the field (or ``payload``) at fault |
| ``problems`` | list of strings | every problem found (``reason`` joins them or names the first) |
| ``job`` | string | the job that dead-lettered it (``infersight-normalize``, ``infersight-metrics``, ...) |
| ``trace_id`` | string or null | the request's trace id where one was read |
| ``source`` | object | ``topic``, ``partition``, ``offset`` of the input (null where a source hides them) |
| ``raw_base64`` | string | the offending bytes, base64, at most ``MAX_PAYLOAD_BYTES`` of them |
| ``raw_size`` | int | the offending bytes' full size |
| ``raw_sha256`` | string | hex SHA-256 of all the offending bytes (find the original in the source topic) |
| ``raw_truncated`` | bool | whether ``raw_base64`` holds only the first ``MAX_PAYLOAD_BYTES`` |
| ``seen_ns`` | int | when the job dead-lettered it (wall clock, ns) |

The cap keeps a dead letter far below the broker's 8 MiB record limit however large the bad input: a payload
copied whole once failed the DLQ write, and the job with it, in a loop.
"""

from __future__ import annotations

MAX_PAYLOAD_BYTES = 256 * 1024  # base64 makes it ~342 KiB: well under the 8 MiB record limit
FIELDS = ("reason", "problems", "job", "trace_id", "source", "raw_base64", "raw_size", "raw_sha256",
          "raw_truncated", "seen_ns")
SOURCE_FIELDS = ("topic", "partition", "offset")

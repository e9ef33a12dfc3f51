"""The normalize job's Flink functions. They live in their own module so Flink pickles them by reference: the
job module runs as ``__main__`` under ``flink run``."""

from __future__ import annotations

import time
from typing import Any

from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import OutputTag, ProcessFunction
from pyflink.datastream.functions import RuntimeContext

from infersight.flink_jobs.normalize.core import normalize
from infersight.flink_jobs.normalize.span_records import TimeBounds
from infersight.schemas.topics import PODS, REQUESTS


class Normalize(ProcessFunction):
    """``(topic, partition, offset, payload)`` rows -> ``(output topic, JSON value, event time ms)``."""

    def __init__(self, bounds: TimeBounds) -> None:
        self.bounds = bounds

    def open(self, runtime_context: RuntimeContext) -> None:
        self.records = runtime_context.get_metrics_group().counter("records")  # requests out (in batches)

    def process_element(self, row: Any, ctx: ProcessFunction.Context):
        yield from normalize(row[0], row[1], row[2], bytes(row[3]), time.time_ns(), self.bounds, self.records.inc)


class EventTime(TimestampAssigner):
    """An output's event time (ms) as its element timestamp: the Kafka sinks write it as the record's."""

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[2]


class Route(ProcessFunction):
    """Requests to the main output, pod gauges and dead letters to their side outputs (JSON values)."""

    def __init__(self, pods_tag: OutputTag, dlq_tag: OutputTag) -> None:
        self.pods_tag, self.dlq_tag = pods_tag, dlq_tag

    def process_element(self, value: Any, ctx: ProcessFunction.Context):
        if value[0] == REQUESTS.name:
            yield value[1]
        elif value[0] == PODS.name:
            yield self.pods_tag, value[1]
        else:
            yield self.dlq_tag, value[1]

"""The normalize job's Flink functions. They live in their own module so Flink pickles them by reference: the
job module runs as ``__main__`` under ``flink run``."""

from __future__ import annotations

import time
from typing import Any

from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import ProcessFunction
from pyflink.datastream.functions import FlatMapFunction, RuntimeContext

from infersight.flink_jobs.normalize.core import normalize
from infersight.flink_jobs.normalize.span_records import TimeBounds


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


class Select(FlatMapFunction):
    """The JSON values of one output topic. One per topic rather than side outputs: a Python function's side
    outputs leave without the element's timestamp (the Kafka sink then stamps the record with the time it
    was written), and the downstream jobs take their event time from those timestamps."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def flat_map(self, value: Any):
        if value[0] == self.topic:
            yield value[1]

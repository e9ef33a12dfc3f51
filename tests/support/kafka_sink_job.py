"""Test-only PyFlink job: writes a few strings to a Kafka topic through the jobs' own sink builder
(``flink_jobs.common.kafka_io.kafka_sink``, at-least-once), on a local MiniCluster, and ends. The sink takes the
client properties of ``INFERSIGHT_KAFKA_PROPERTIES`` as the jobs' sinks do.

    python -m tests.support.kafka_sink_job BROKERS TOPIC VALUE [VALUE ...]
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from pyflink.common import Types

    from infersight.flink_jobs.common.environment import execution_environment
    from infersight.flink_jobs.common.kafka_io import kafka_sink
    from infersight.stack import jobs

    brokers, topic, *values = argv
    env = execution_environment(jobs.job_jar_urls())
    env.set_parallelism(1)
    (env.from_collection(values, type_info=Types.STRING())
     .sink_to(kafka_sink(brokers, topic, "test-kafka-sink-job", exactly_once=False)))
    env.execute("test-kafka-sink-job")


if __name__ == "__main__":
    main(sys.argv[1:])

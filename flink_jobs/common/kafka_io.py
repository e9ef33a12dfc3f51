"""Kafka sources and sinks shared by the jobs: sources read committed records from the group's offsets,
sinks are transactional (exactly-once with checkpoints) by default.

Client security (TLS, SASL) is deployment configuration, not code: when ``INFERSIGHT_KAFKA_PROPERTIES`` names
a Java properties file (``security.protocol=SASL_SSL``, ``sasl.mechanism``, ``sasl.jaas.config``,
``ssl.truststore.*``...), every source and sink a job builds gets those properties (read when the job is built,
in the client that submits it; the stack writes the file, see ``infersight.stack.security``)."""

from __future__ import annotations

import os
from collections.abc import Mapping

KAFKA_PROPERTIES_ENV = "INFERSIGHT_KAFKA_PROPERTIES"
QUIET_S = 60.0  # default silence after which event time follows the wall clock (``event_time``)


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` (or ``key: value``) lines of a Java properties file; ``#``/``!`` comments and blank lines
    skipped. No line continuations or escapes: one property per line."""
    props = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ValueError(f"not a key=value line in a Kafka properties file: {raw!r}")
        props[line[:cut].strip()] = line[cut + 1:].strip()
    return props


def client_properties(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The extra Kafka client properties of this deployment (``INFERSIGHT_KAFKA_PROPERTIES``); none if unset."""
    path = (os.environ if environ is None else environ).get(KAFKA_PROPERTIES_ENV, "").strip()
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        return parse_properties(f.read())


def sql_client_options(properties: Mapping[str, str] | None = None) -> str:
    """The same properties as options of a SQL Kafka table (``'properties.<key>' = '<value>'``), each preceded by
    a comma, to append inside its WITH clause; empty when there are none."""
    props = client_properties() if properties is None else properties
    return "".join(f",\n'properties.{k}' = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in props.items())


def kafka_source(brokers: str, topic: str, group_id: str, value_schema=None, start_ms: int | None = None,
                 earliest: bool = False):
    """A KafkaSource of ``topic``'s values (strings unless ``value_schema``), from the group's committed offsets
    (the earliest without them), or from the first record stamped at or after ``start_ms`` (see
    ``add_start_option``), or from the earliest offset (``earliest``: a compacted topic read whole at each fresh
    start), reading only committed records (what an upstream job's checkpoints committed). A restore from a
    checkpoint continues from its offsets either way."""
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetResetStrategy, KafkaOffsetsInitializer, KafkaSource

    start = (KafkaOffsetsInitializer.earliest() if earliest
             else KafkaOffsetsInitializer.committed_offsets(KafkaOffsetResetStrategy.EARLIEST) if start_ms is None
             else KafkaOffsetsInitializer.timestamp(start_ms))
    builder = (KafkaSource.builder().set_bootstrap_servers(brokers).set_topics(topic)
               .set_group_id(group_id)
               .set_starting_offsets(start)
               .set_property("isolation.level", "read_committed")  # only committed upstream output
               .set_value_only_deserializer(value_schema or SimpleStringSchema()))
    for key, value in client_properties().items():
        builder.set_property(key, value)
    return builder.build()


def keyed_sink(env, rows, table: str, brokers: str, topic: str, deployment: str, key: str, value: str,
               exactly_once: bool = True):
    """Writes ``rows`` (a stream of ``Row(key, value)`` strings, named ``key`` and ``value``) to ``topic`` with
    ``key`` as the Kafka record key, through the SQL Kafka table ``table``: the DataStream KafkaSink cannot take
    a key from a field in PyFlink. Returns the statement set, attached to ``env``'s graph."""
    from pyflink.table import StreamTableEnvironment

    t_env = StreamTableEnvironment.create(env)
    guarantee = "exactly-once" if exactly_once else "at-least-once"
    t_env.execute_sql(f"""
        CREATE TABLE {table} (
            `{key}` STRING NOT NULL,
            `{value}` STRING NOT NULL
        ) WITH (
            'connector' = 'kafka',
            'topic' = '{topic}',
            'properties.bootstrap.servers' = '{brokers}',
            'key.format' = 'raw',
            'key.fields' = '{key}',
            'value.format' = 'raw',
            'value.fields-include' = 'EXCEPT_KEY',
            'sink.delivery-guarantee' = '{guarantee}',
            'sink.transactional-id-prefix' = '{deployment}-{topic}',
            'properties.transaction.timeout.ms' = '600000'{sql_client_options()}
        )""")
    statements = t_env.create_statement_set()
    statements.add_insert(table, t_env.from_data_stream(rows))
    statements.attach_as_datastream()
    return statements


def add_start_option(parser) -> None:
    parser.add_argument("--start-ms", type=int, default=None,
                        help="a fresh start reads each source from its first record stamped at or after this time "
                             "(epoch ms) instead of the group's committed offsets (the earliest without them): a new "
                             "deployment that should not reprocess the topics' whole retention. A restore from a "
                             "checkpoint or savepoint continues from its offsets")


def add_quiet_option(parser) -> None:
    parser.add_argument("--quiet-s", type=float, default=QUIET_S,
                        help="once the source has read nothing this long (at least --idle-s), event time follows "
                             "the wall clock this far behind it: a burst's last windows close at most window + "
                             "this + the checkpoint interval after traffic stops; a record arriving later than "
                             "that after a silence is late")


def event_time(out_of_orderness_s: float, idle_s: float, quiet_s: float):
    """Watermarks from the Kafka records' timestamps (the records' event times: normalize writes them), per
    partition inside the source, in the JVM; a partition silent for ``idle_s`` is idle, and once the whole
    source has read nothing for ``quiet_s`` (back-pressure does not count), event time follows the wall clock
    ``quiet_s`` behind it, so the last windows before a silence close (``QuietWatermarks.java``, beside this
    module; set-up compiles it into a jar every job ships). A fresh strategy per call: a used one holds a Java
    handle."""
    from pyflink.common import WatermarkStrategy
    from pyflink.java_gateway import get_gateway

    quiet = get_gateway().jvm.io.infersight.flink.QuietWatermarks
    return WatermarkStrategy(quiet.of(int(out_of_orderness_s * 1000), int(idle_s * 1000), int(quiet_s * 1000)))


def kafka_sink(brokers: str, topic: str, deployment: str, value_schema=None, exactly_once: bool = True):
    """A KafkaSink to ``topic``. ``deployment`` (the job's consumer group id) prefixes the transactional
    ids: two running jobs with the same prefix fence each other's producers, so each deployment of a
    job needs its own, and a restored job must keep it to abort its own lingering transactions."""
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema, KafkaSink

    builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(brokers)
        .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(topic)
                               .set_value_serialization_schema(value_schema or SimpleStringSchema()).build())
        # Longer than a restart takes, shorter than the broker's transaction.max.timeout.ms (15 min).
        .set_property("transaction.timeout.ms", "600000")
        .set_property("compression.type", "zstd")
        # Uncompressed; the default 1 MB fails the job in a loop on one big record (a dead letter carries
        # its whole payload). The broker's message.max.bytes (8 MiB) bounds the compressed batch.
        .set_property("max.request.size", "8388608")
    )
    for key, value in client_properties().items():
        builder.set_property(key, value)
    if exactly_once:
        return (builder.set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
                .set_transactional_id_prefix(f"{deployment}-{topic}").build())
    return builder.set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE).build()

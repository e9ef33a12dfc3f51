"""Kafka checks and topic creation through the real Kafka admin protocol (confluent-kafka).

Each function takes the transport security to use (``security``); by default, the environment's
(``TransportSecurity.from_env()``: none unless ``INFERSIGHT_KAFKA_SASL_*`` is set)."""

from __future__ import annotations

from collections.abc import Iterable

from infersight.schemas.topics import ALL_TOPICS, Topic
from infersight.stack.security import TransportSecurity


def _admin(bootstrap: str, security: TransportSecurity | None = None):
    from confluent_kafka.admin import AdminClient

    secure = (security or TransportSecurity.from_env()).librdkafka_config()
    # Quiet: a broker that is still starting is expected during health polling.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "socket.timeout.ms": 2000, **secure})


def kafka_ready(bootstrap: str, timeout: float = 2.0, security: TransportSecurity | None = None) -> bool:
    client = _admin(bootstrap, security)  # outside the try: a settings error is not "not up yet"
    try:
        metadata = client.list_topics(timeout=timeout)
    except Exception:  # KafkaException while the broker is not up yet
        return False
    return bool(metadata.brokers)


def wait_ready(bootstrap: str, timeout_s: float = 60.0, security: TransportSecurity | None = None) -> None:
    import time

    from infersight.stack.errors import StackError

    deadline = time.monotonic() + timeout_s
    while not kafka_ready(bootstrap, security=security):
        if time.monotonic() > deadline:
            raise StackError(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s",
                             "start Kafka first, or pass the right --bootstrap address")
        time.sleep(1)


def existing_topics(bootstrap: str, timeout: float = 5.0, security: TransportSecurity | None = None) -> set[str]:
    return set(_admin(bootstrap, security).list_topics(timeout=timeout).topics)


def ensure_topics(bootstrap: str, topics: Iterable[Topic] = ALL_TOPICS,
                  security: TransportSecurity | None = None) -> list[str]:
    """Create the project's topics that are missing; returns the names created."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap, security)
    have = set(admin.list_topics(timeout=10).topics)
    missing = [t for t in topics if t.name not in have]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config())
         for t in missing],
        operation_timeout=30,
    )
    for future in futures.values():
        try:
            future.result()
        except Exception as exc:  # already exists after a race is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return [t.name for t in missing]


def fence_transactions(bootstrap: str, transactional_ids: Iterable[str], timeout_s: float = 30.0,
                       security: TransportSecurity | None = None) -> int:
    """Abort whatever transaction each id has open, by registering a new producer under it (what a restored
    Flink job's KafkaSink does to its own lingering transactions). For a job cancelled for good: otherwise its
    open transactions pin every read_committed reader of their partitions until ``transaction.timeout.ms``.
    Returns how many ids were fenced."""
    from concurrent.futures import ThreadPoolExecutor

    from confluent_kafka import Producer

    secure = (security or TransportSecurity.from_env()).librdkafka_config()

    def fence(tid: str) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "log_level": 0, **secure})
        producer.init_transactions(timeout_s)  # bumps the epoch: the coordinator aborts the open transaction

    ids = list(transactional_ids)
    with ThreadPoolExecutor(8) as pool:  # each call is a round trip to the coordinator, not CPU
        list(pool.map(fence, ids))
    return len(ids)

"""A job cancelled for good leaves Kafka transactions open; ``fence_transactions`` (what ``stack.jobs.stop``
does after falling back to a cancel) must release the read_committed readers they block."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from infersight.stack.jobs import sink_transactional_ids
from infersight.stack.kafka_admin import fence_transactions
from tests.integration.pipeline_util import read_all


def test_fencing_an_abandoned_transaction_releases_read_committed_readers(stack):
    bootstrap = stack.layout.kafka_bootstrap
    topic = f"test-fence-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its futures
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    tid = sink_transactional_ids("test-job", 1, 0, ahead=1)[0]  # an id as the job's sink names it

    abandoned = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    abandoned.init_transactions(30)
    abandoned.begin_transaction()
    abandoned.produce(topic, b"never committed")
    abandoned.flush(30)  # on the broker, in an open transaction: the partition's last stable offset stops here
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"after")
    assert plain.flush(30) == 0
    assert read_all(bootstrap, topic) == []  # pinned behind the open transaction

    assert fence_transactions(bootstrap, [tid]) == 1
    assert [m.value() for m in read_all(bootstrap, topic)] == [b"after"]  # aborted, and the reader moves on


def test_sink_transactional_ids_follow_the_connectors_naming():
    ids = sink_transactional_ids("infersight-metrics", parallelism=2, last_checkpoint=41, ahead=2)
    assert "infersight-metrics-infersight.metrics-0-42" in ids
    assert "infersight-metrics-infersight.metrics-1-43" in ids
    assert not any(i.endswith("-41") or i.endswith("-44") for i in ids)

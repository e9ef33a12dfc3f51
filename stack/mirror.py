"""MirrorMaker 2 between the regional Kafka clusters and the global one, described once.

Each region's gateways write ``infersight.otlp.*`` into their regional Kafka; one MirrorMaker 2 on the
global side copies them to ``<region>.infersight.otlp.*`` (``DefaultReplicationPolicy``: the region comes
from the topic name, not from a pod attribute). This module is the single description of that mirror: the
native stack's dedicated-mode properties and the Helm chart's Strimzi ``KafkaMirrorMaker2`` both come from
it (``infersight.stack.chart_files`` writes the chart's copy; a unit test fails when the chart differs).

Why each setting (measured with a dedicated MM2 4.3.1 against 4.4.0 brokers, issue #25):
- exactly-once into the global cluster: a restarted MM2 must not double-count requests;
- ``<alias>.scheduled.rebalance.max.delay.ms``: with Connect's default (5 min) the heartbeat flow stayed
  down 5 minutes after a link came back; only the per-cluster key takes effect in dedicated mode;
- ``<alias>.plugin.discovery = service_load``: each of MM2's herders (one per flow) scanned the classpath by
  reflection when it started, 2-6 s apiece on this machine, on the path of every restart (a ``kill -9``);
- ``offset-syncs.topic.location = target``: MM2 writes nothing into the regional clusters;
- record size limits: the gateways send records up to the brokers' ``message.max.bytes`` (8 MiB);
- topic configs synced: a global topic keeps the retention ``schemas/topics.py`` gives it;
- heartbeats for the mirrored flows only: MM2 starts a herder, with its internal topics, for every pair of
  clusters that emits heartbeats, so on by default it wrote configs, offsets and status topics into every
  regional cluster;
- no checkpoints: no consumer group reads a regional cluster, so there is nothing to translate. MM2 still
  logs one ``ERROR Failed to configure MirrorCheckpointConnector`` per flow when it starts: expected.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from infersight.schemas.topics import ALL_TOPICS, OTLP_METRICS, OTLP_REQUESTS, Topic

GLOBAL_ALIAS = "global"
REPLICATION_POLICY = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
# The brokers' message.max.bytes (stack/config/kafka/server.properties): the largest record a gateway sends.
MAX_RECORD_BYTES = 8 * 1024 * 1024
# A fetch or request must hold one whole record plus its batch overhead.
CLIENT_MAX_BYTES = 2 * MAX_RECORD_BYTES
REBALANCE_MAX_DELAY_MS = 5_000
PLUGIN_DISCOVERY = "service_load"
# Strimzi runs MM2 as a Connect cluster: every flow's source offsets go to this one topic on the global cluster
# (dedicated mode's are mm2-offsets.<alias>.internal); the region status service reads MM2's progress there.
OFFSET_STORAGE_TOPIC = "infersight-mirror.offsets"
# A region name is a DNS label: it names Kubernetes objects and prefixes topic names.
REGION_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def mirrored_topics(topics: tuple[Topic, ...] = ALL_TOPICS) -> list[Topic]:
    """The regional topics MM2 copies: the gateways' raw OTLP (everything derived is computed globally)."""
    return [t for t in topics if t.name.startswith("infersight.otlp.")]


def topics_regex(topics: list[Topic] | None = None) -> str:
    """MM2's ``topics`` (a comma-separated list of regular expressions), exact names, dots escaped."""
    return ",".join(re.escape(t.name) for t in (topics if topics is not None else mirrored_topics()))


def global_topic(region: str, topic: Topic) -> str:
    """The name ``DefaultReplicationPolicy`` gives ``topic`` from ``region`` on the global cluster."""
    return f"{region}.{topic.name}"


# What normalize reads by default (its --source-topics): on the global cluster, once per region, mirrored.
NORMALIZE_SOURCES: tuple[Topic, ...] = (OTLP_REQUESTS, OTLP_METRICS)


def global_topics(regions: tuple[str, ...] | list[str]) -> list[Topic]:
    """The mirrored topics on the global cluster, created up front with ``schemas/topics.py``'s partitions and
    retention (MM2 keeps an existing topic's partitions; the jobs subscribe before the first record crosses)."""
    return [dataclasses.replace(t, name=global_topic(r, t)) for r in regions for t in mirrored_topics()]


def normalize_sources(regions: tuple[str, ...] | list[str]) -> list[str]:
    """normalize's ``--source-topics`` on the global cluster: its default topics, as every region's mirror."""
    return [global_topic(r, t) for r in regions for t in NORMALIZE_SOURCES]


def check_regions(regions: list[str] | tuple[str, ...]) -> None:
    """Refuse what would break the topic names or the cluster aliases, naming the value."""
    if not regions:
        raise ValueError("no regions: the mirror needs at least one")
    for r in regions:
        if not REGION_NAME.match(r):
            raise ValueError(f"region {r!r} is not a DNS label (lowercase letters, digits and '-', at most 63)")
        if r == GLOBAL_ALIAS:
            raise ValueError(f"region {r!r} is the global cluster's alias")
    dup = sorted({r for r in regions if list(regions).count(r) > 1})
    if dup:
        raise ValueError(f"duplicate regions: {', '.join(dup)}")


def source_connector_config(replication_factor: int) -> dict[str, str]:
    """The MirrorSourceConnector's settings (same keys natively and in Strimzi's ``sourceConnector.config``)."""
    return {
        "replication.policy.class": REPLICATION_POLICY,
        "replication.factor": str(replication_factor),
        "offset-syncs.topic.replication.factor": str(replication_factor),
        "offset-syncs.topic.location": "target",
        "sync.topic.configs.enabled": "true",
        "sync.topic.acls.enabled": "false",
        "refresh.topics.interval.seconds": "30",
        "exactly.once.support": "required",
        "consumer.isolation.level": "read_committed",
    }


def source_client_config() -> dict[str, str]:
    """Consumer settings on a regional cluster: fetch whole 8 MiB records."""
    return {
        "consumer.max.partition.fetch.bytes": str(CLIENT_MAX_BYTES),
        "consumer.fetch.max.bytes": str(CLIENT_MAX_BYTES),
    }


def target_client_config() -> dict[str, str]:
    """Producer settings on the global cluster: send whole 8 MiB records."""
    return {
        "producer.max.request.size": str(CLIENT_MAX_BYTES),
        "producer.buffer.memory": str(4 * CLIENT_MAX_BYTES),
    }


def _trusting(ca_secret: str) -> dict:
    """Strimzi's TLS settings of a cluster whose CA is the ``ca.crt`` of Secret ``ca_secret``."""
    return {"trustedCertificates": [{"secretName": ca_secret, "certificate": "ca.crt"}]}


@dataclass(frozen=True)
class Mirror:
    """One MM2 from every region into the global cluster."""

    regions: tuple[str, ...]
    replication_factor: int = 1

    def __post_init__(self) -> None:
        check_regions(self.regions)

    def native_properties(self, bootstrap: dict[str, str], rest_listener: str | None = None) -> dict[str, str]:
        """A dedicated-mode ``mm2.properties`` (``connect-mirror-maker.sh``), given each alias's bootstrap;
        ``rest_listener``: where the internal REST server binds (``http://HOST:PORT``; Connect's default is
        every interface on 8083)."""
        missing = [a for a in (*self.regions, GLOBAL_ALIAS) if a not in bootstrap]
        if missing:
            raise ValueError(f"no bootstrap servers for cluster alias(es) {', '.join(missing)}")
        props: dict[str, str] = {
            "clusters": ", ".join((*self.regions, GLOBAL_ALIAS)),
            "dedicated.mode.enable.internal.rest": "true",
            f"{GLOBAL_ALIAS}.exactly.once.source.support": "enabled",
            # MM2 runs a herder (config, offset and status topics) for every pair of clusters whose heartbeats are on:
            # off by default, on for the mirrored flows only, so nothing is written into a regional cluster
            "emit.heartbeats.enabled": "false",
            # connector settings, read per flow (not per cluster alias): the heartbeats topic on one broker
            "heartbeats.topic.replication.factor": str(self.replication_factor),
            "checkpoints.topic.replication.factor": str(self.replication_factor),
            "emit.checkpoints.enabled": "false",
            "sync.group.offsets.enabled": "false",
        }
        if rest_listener:
            props["listeners"] = rest_listener
        for key, value in source_connector_config(self.replication_factor).items():
            props[key] = value
        for alias in (*self.regions, GLOBAL_ALIAS):
            props[f"{alias}.bootstrap.servers"] = bootstrap[alias]
            props[f"{alias}.scheduled.rebalance.max.delay.ms"] = str(REBALANCE_MAX_DELAY_MS)
            props[f"{alias}.plugin.discovery"] = PLUGIN_DISCOVERY
            props[f"{alias}.config.storage.replication.factor"] = str(self.replication_factor)
            props[f"{alias}.offset.storage.replication.factor"] = str(self.replication_factor)
            props[f"{alias}.status.storage.replication.factor"] = str(self.replication_factor)
        for region in self.regions:
            props[f"{region}->{GLOBAL_ALIAS}.enabled"] = "true"
            props[f"{region}->{GLOBAL_ALIAS}.emit.heartbeats.enabled"] = "true"
            props[f"{region}->{GLOBAL_ALIAS}.topics"] = topics_regex()
            for key, value in source_client_config().items():
                props[f"{region}.{key}"] = value
        for key, value in target_client_config().items():
            props[f"{GLOBAL_ALIAS}.{key}"] = value
        return props

    def strimzi_spec(self, bootstrap: dict[str, str], version: str, replicas: int = 1,
                     ca_secrets: dict[str, str] | None = None) -> dict:
        """The ``spec`` of a Strimzi ``kafka.strimzi.io/v1`` ``KafkaMirrorMaker2`` with the same settings.
        ``ca_secrets``: region -> the Secret holding its cluster CA (``ca.crt``): that region's link is TLS (the
        region chart's ``mirror`` listener), verified against it."""
        cas = ca_secrets or {}
        target_config = {
            "exactly.once.source.support": "enabled",
            "scheduled.rebalance.max.delay.ms": REBALANCE_MAX_DELAY_MS,
            "config.storage.replication.factor": self.replication_factor,
            "offset.storage.replication.factor": self.replication_factor,
            "status.storage.replication.factor": self.replication_factor,
            **target_client_config(),
        }
        return {
            "version": version,
            "replicas": replicas,
            "target": {
                "alias": GLOBAL_ALIAS,
                "bootstrapServers": bootstrap[GLOBAL_ALIAS],
                "groupId": "infersight-mirror",
                "configStorageTopic": "infersight-mirror.configs",
                "offsetStorageTopic": OFFSET_STORAGE_TOPIC,
                "statusStorageTopic": "infersight-mirror.status",
                "config": target_config,
            },
            "mirrors": [
                {
                    "source": {"alias": region, "bootstrapServers": bootstrap[region],
                               **({"tls": _trusting(cas[region])} if region in cas else {}),
                               "config": source_client_config()},
                    "sourceConnector": {"tasksMax": len(mirrored_topics()),
                                        "config": source_connector_config(self.replication_factor)},
                    "topicsPattern": topics_regex().replace(",", "|"),
                }
                for region in self.regions
            ],
        }

"""The one description of MirrorMaker 2 (stack/mirror.py) and the chart files generated from it."""

from __future__ import annotations

import re

import pytest
import yaml

from infersight.schemas.topics import ALL_TOPICS
from infersight.stack import chart_files, mirror

REGIONS = ("us-east-1", "eu-west-1")
BOOT = {"us-east-1": "a:9093", "eu-west-1": "b:9093", "global": "g:9092"}


def test_only_the_raw_otlp_topics_are_mirrored_and_the_regex_matches_exactly_them():
    names = {t.name for t in mirror.mirrored_topics()}
    assert names == {t.name for t in ALL_TOPICS if t.name.startswith("infersight.otlp.")}
    pattern = re.compile(mirror.topics_regex().replace(",", "|"))
    for t in ALL_TOPICS:
        assert bool(pattern.fullmatch(t.name)) == (t.name in names), t.name
    assert not pattern.fullmatch("infersightXotlp.spans")  # dots are escaped


def test_global_topics_take_the_region_prefix_of_the_default_replication_policy():
    t = mirror.mirrored_topics()[0]
    assert mirror.global_topic("eu-west-1", t) == f"eu-west-1.{t.name}"


@pytest.mark.parametrize("regions, message", [
    ((), "no regions"),
    (("EU_West",), "'EU_West' is not a DNS label"),
    (("global",), "'global' is the global cluster's alias"),
    (("eu-west-1", "us-east-1", "eu-west-1"), "duplicate regions: eu-west-1"),
    (("a" * 64,), "is not a DNS label"),
])
def test_bad_regions_are_refused_naming_the_value(regions, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        mirror.Mirror(regions)


def test_native_properties_carry_every_setting_the_issue_lists():
    props = mirror.Mirror(REGIONS).native_properties(BOOT)
    assert props["clusters"] == "us-east-1, eu-west-1, global"
    assert props["replication.policy.class"] == "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
    assert props["global.exactly.once.source.support"] == "enabled"
    assert props["dedicated.mode.enable.internal.rest"] == "true"
    assert props["offset-syncs.topic.location"] == "target"
    assert props["sync.topic.configs.enabled"] == "true"
    for alias in (*REGIONS, "global"):
        assert props[f"{alias}.scheduled.rebalance.max.delay.ms"] == "5000"  # only the per-cluster key works
        assert props[f"{alias}.plugin.discovery"] == "service_load"  # a restart does not scan the classpath
        assert props[f"{alias}.bootstrap.servers"] == BOOT[alias]
    for region in REGIONS:
        assert props[f"{region}->global.enabled"] == "true"
        assert props[f"{region}->global.topics"] == mirror.topics_regex()
        # one 8 MiB record fits a fetch
        assert int(props[f"{region}.consumer.max.partition.fetch.bytes"]) >= mirror.MAX_RECORD_BYTES
    assert int(props["global.producer.max.request.size"]) >= mirror.MAX_RECORD_BYTES
    assert "global->us-east-1.enabled" not in props  # one direction only
    # heartbeats (and with them MM2's herders and internal topics) only for the mirrored flows, none in a region
    assert props["emit.heartbeats.enabled"] == "false"
    assert all(props[f"{r}->global.emit.heartbeats.enabled"] == "true" for r in REGIONS)
    assert props["heartbeats.topic.replication.factor"] == "1"


def test_native_properties_name_a_missing_bootstrap():
    with pytest.raises(ValueError, match="eu-west-1"):
        mirror.Mirror(REGIONS).native_properties({"us-east-1": "a:1", "global": "g:1"})


def test_strimzi_spec_has_the_same_connector_settings_as_the_native_config():
    m = mirror.Mirror(REGIONS, replication_factor=3)
    spec = m.strimzi_spec(BOOT, version="4.3.1")
    native = m.native_properties(BOOT)
    assert [x["source"]["alias"] for x in spec["mirrors"]] == list(REGIONS)
    for x in spec["mirrors"]:
        for key, value in x["sourceConnector"]["config"].items():
            if key in native:
                assert native[key] == value, key
        assert re.compile(x["topicsPattern"]).fullmatch("infersight.otlp.requests")
    assert spec["target"]["config"]["exactly.once.source.support"] == "enabled"
    assert spec["target"]["config"]["scheduled.rebalance.max.delay.ms"] == 5000
    assert spec["mirrors"][0]["sourceConnector"]["config"]["replication.factor"] == "3"


def test_the_chart_files_are_exactly_what_the_generator_writes():
    problems = chart_files.differences()
    assert not problems, "deploy/helm is out of date (run python -m infersight.stack.chart_files): " \
                         + "; ".join(problems)


def test_the_check_names_a_hand_edited_chart_file(tmp_path):
    chart_files.write(tmp_path)
    assert chart_files.differences(tmp_path) == []
    edited = tmp_path / "infersight-global/files/mirror.yaml"
    doc = yaml.safe_load(edited.read_text())
    doc["tasksMax"] = 99
    edited.write_text(yaml.safe_dump(doc))
    assert chart_files.differences(tmp_path) == ["infersight-global/files/mirror.yaml"]

"""The region status service's arguments come from one place (``service_args``): the native stack starts it with
them, the global chart's Deployment renders the same (tests/integration/test_deploy_check.py compares), and the
service's own parser reads them back. Where MM2's progress is read: dedicated mode's per-alias offsets topics and,
under Strimzi, the Connect cluster's one offsets topic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from infersight.stack import mirror, multiregion
from infersight.stack.components import StackLayout
from infersight.stack.ports import PortPlan
from infersight.stack.region_status_service import (
    DEFAULT_PORT,
    MODULE,
    RegionStatusService,
    arg_parser,
    is_offsets_topic,
    link_client_config,
    service_args,
)

ROOT = Path(__file__).resolve().parents[2]
GLOBAL_VALUES = ROOT / "deploy" / "helm" / "infersight-global" / "values.yaml"


def test_the_native_stack_starts_the_service_with_service_args(tmp_path):
    lay = StackLayout(tmp_path, PortPlan.free(topology="multi-region"))
    component = multiregion.region_status(lay)
    links = {r: f"127.0.0.1:{lay.ports.regional_kafka[i].relay}" for i, r in enumerate(lay.regions)}
    assert component.argv == [sys.executable, "-m", MODULE,
                              *service_args(lay.kafka_bootstrap, links, "127.0.0.1", lay.ports.region_status)]
    # each region as MM2 reaches it: through its link
    assert links == {r: b for r, b in multiregion.mirror_bootstrap(lay).items() if r != mirror.GLOBAL_ALIAS}


def test_service_args_are_what_the_service_parses():
    links = {"us-east-1": "a:9093,b:9093", "eu-west-1": "c:9093"}
    args = arg_parser().parse_args(service_args("g:9092", links, "0.0.0.0", 8084,
                                                offsets_topic=mirror.OFFSET_STORAGE_TOPIC))
    assert (args.global_brokers, args.host, args.port) == ("g:9092", "0.0.0.0", 8084)
    assert dict(args.region) == links and list(dict(args.region)) == list(links)  # order kept
    assert args.offsets_topic == [mirror.OFFSET_STORAGE_TOPIC]
    assert arg_parser().parse_args(service_args("g:9092", links, "h", 1)).offsets_topic == []
    cas = {"eu-west-1": "/etc/ca/eu/ca.crt"}
    assert dict(arg_parser().parse_args(service_args("g:9092", links, "h", 1, cas=cas)).region_ca) == cas
    assert arg_parser().parse_args(service_args("g:9092", links, "h", 1)).region_ca == []


def test_a_region_with_a_ca_is_probed_over_tls_verified_against_it():
    tls = link_client_config("r:9093", "/etc/ca/r/ca.crt")
    assert (tls["security.protocol"], tls["ssl.ca.location"], tls["bootstrap.servers"]) == (
        "SSL", "/etc/ca/r/ca.crt", "r:9093")
    assert "security.protocol" not in link_client_config("127.0.0.1:1", None)  # the native stack's loopback relay


def test_a_ca_for_a_region_without_a_link_is_refused():
    with pytest.raises(ValueError, match="eu-west-1"):
        RegionStatusService("g:9092", {"us-east-1": "r:9093"}, cas={"eu-west-1": "/ca.crt"})


def test_mm2_offsets_are_read_in_dedicated_mode_and_from_strimzis_connect_topic():
    assert is_offsets_topic("mm2-offsets.eu-west-1.internal")
    assert not is_offsets_topic(mirror.OFFSET_STORAGE_TOPIC)
    assert is_offsets_topic(mirror.OFFSET_STORAGE_TOPIC, frozenset({mirror.OFFSET_STORAGE_TOPIC}))
    assert not is_offsets_topic("infersight-mirror.status", frozenset({mirror.OFFSET_STORAGE_TOPIC}))
    spec = mirror.Mirror(("eu-west-1",)).strimzi_spec({"eu-west-1": "r:9093", "global": "g:9092"}, "4.3.1")
    assert spec["target"]["offsetStorageTopic"] == mirror.OFFSET_STORAGE_TOPIC


def test_the_global_charts_default_port_is_the_services():
    values = yaml.safe_load(GLOBAL_VALUES.read_text())["regionStatus"]
    assert values["enabled"] is True and values["port"] == DEFAULT_PORT

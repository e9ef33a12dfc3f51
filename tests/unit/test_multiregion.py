"""The multi-region topology's configuration (ports, components, MirrorMaker 2's properties, normalize's sources)
and the link relay (``stack/relay.py``) against real sockets."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from infersight.flink_jobs.normalize.core import normalize
from infersight.schemas.topics import DLQ
from infersight.stack import components, jobs, mirror, multiregion, statefile
from infersight.stack.components import StackLayout
from infersight.stack.errors import StackError
from infersight.stack.ports import PortPlan

MULTI = "multi-region"


@pytest.mark.parametrize("plan", [PortPlan.default(topology=MULTI), PortPlan.from_base(20000, topology=MULTI),
                                  PortPlan.free(topology=MULTI)])
def test_multi_region_plans_have_distinct_ports_and_round_trip(plan):
    ports = [p for _, p in plan.named()]
    assert len(ports) == len(set(ports)) == 11 + 5 * 3 + 5 * 3 + 2  # + per region 5, + MM2, + region status
    assert plan.topology == MULTI and len(plan.regional_kafka) == 3 and plan.mirrormaker
    assert PortPlan.from_dict(plan.to_dict()) == plan


def test_single_is_the_default_and_an_unknown_topology_is_refused():
    assert PortPlan.default().topology == PortPlan.free().topology == "single"
    assert PortPlan.default().regional_kafka == () and PortPlan.default().mirrormaker == 0
    with pytest.raises(StackError, match="unknown topology 'mesh'"):
        PortPlan.free(topology="mesh")


def test_a_multi_region_plan_saved_before_mm2_had_a_port_gets_its_schemes():
    saved = {**PortPlan.from_base(20000, topology=MULTI).to_dict(), "mirrormaker": 0}
    assert PortPlan.from_dict(saved) == PortPlan.from_base(20000, topology=MULTI)


def _cli_stack(tmp_path, **opts):
    from infersight import cli

    return cli._stack(argparse.Namespace(state_dir=str(tmp_path), stack="x", **opts))


def test_the_topology_is_remembered_in_the_state_file_like_the_ports(tmp_path):
    plan = PortPlan.free(topology=MULTI)
    statefile.write_json(tmp_path / "stack.json", {"ports": plan.to_dict(), "pids": {}})
    assert _cli_stack(tmp_path).layout.ports == plan  # status, down, simulate, jobs: no option needed
    assert _cli_stack(tmp_path, topology=MULTI).layout.ports == plan  # same topology: the saved ports
    assert _cli_stack(tmp_path, topology="single").layout.ports.topology == "single"
    assert _cli_stack(tmp_path, topology=MULTI, base_port=21000).layout.ports == PortPlan.from_base(21000,
                                                                                                  topology=MULTI)


def test_components_of_each_topology(tmp_path):
    single = [c.name for c in StackLayout(tmp_path, PortPlan.free()).components()]
    multi = [c.name for c in StackLayout(tmp_path, PortPlan.free(topology=MULTI)).components()]
    extra = [n for n in multi if n not in single]
    assert extra == ["kafka-us-east-1", "link-us-east-1", "kafka-eu-west-1", "link-eu-west-1",
                     "kafka-ap-southeast-1", "link-ap-southeast-1", "mirrormaker", "region-status"]
    assert multi.index("mirrormaker") == multi.index("kafka") + 1  # after the global broker it writes to
    assert multi.index("region-status") == multi.index("mirrormaker") + 1


def test_each_gateway_writes_to_its_own_region_and_the_jobs_to_the_global_broker(tmp_path):
    lay = StackLayout(tmp_path, PortPlan.free(topology=MULTI))
    for i, region in enumerate(lay.regions):
        env = lay.gateway(i, region).env
        assert env["INFERSIGHT_KAFKA_BROKERS"] == f"127.0.0.1:{lay.ports.regional_kafka[i].broker}"
    assert lay.sink().env["INFERSIGHT_KAFKA_BROKERS"] == lay.kafka_bootstrap == f"127.0.0.1:{lay.ports.kafka}"
    single = StackLayout(tmp_path, PortPlan.free())
    assert single.gateway(0, single.regions[0]).env["INFERSIGHT_KAFKA_BROKERS"] == single.kafka_bootstrap


def test_regional_brokers_advertise_the_relay_on_a_listener_for_mm2_only(tmp_path, monkeypatch):
    monkeypatch.setattr(components.subprocess, "run", lambda *a, **k: None)  # no storage format here
    lay = StackLayout(tmp_path, PortPlan.free(topology=MULTI))
    p = lay.ports.regional_kafka[1]
    broker = {c.name: c for c in lay.components()}["kafka-eu-west-1"]
    broker.prepare()
    conf = (tmp_path / "kafka-eu-west-1" / "server.properties").read_text()
    assert f"listeners=PLAINTEXT://127.0.0.1:{p.broker},CONTROLLER://127.0.0.1:{p.controller}," \
           f"MIRROR://127.0.0.1:{p.mirror}\n" in conf
    assert f"advertised.listeners=PLAINTEXT://127.0.0.1:{p.broker},MIRROR://127.0.0.1:{p.relay}\n" in conf
    assert "MIRROR:PLAINTEXT" in conf and f"log.dirs={tmp_path / 'data' / 'kafka-eu-west-1'}" in conf
    assert "-Xmx384m" in broker.argv
    relay = {c.name: c for c in lay.components()}["link-eu-west-1"]
    assert relay.argv[-6:] == ["--listen", f"127.0.0.1:{p.relay}", "--upstream", f"127.0.0.1:{p.mirror}",
                               "--control", f"127.0.0.1:{p.relay_control}"]


def test_mirrormaker_reads_each_region_through_its_link_from_the_one_description(tmp_path, monkeypatch):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "connect-mirror-4.3.1.jar").touch()
    monkeypatch.setattr(multiregion.paths, "mirror_classpath_dir", lambda: jars)
    lay = StackLayout(tmp_path, PortPlan.free(topology=MULTI))
    mm2 = multiregion.mirrormaker(lay)
    mm2.prepare()
    text = (tmp_path / "mirrormaker" / "mm2.properties").read_text()
    props = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    bootstrap = {r: f"127.0.0.1:{lay.ports.regional_kafka[i].relay}" for i, r in enumerate(lay.regions)}
    assert props == mirror.Mirror(lay.regions).native_properties({**bootstrap, "global": lay.kafka_bootstrap},
                                                                 f"http://127.0.0.1:{lay.ports.mirrormaker}")
    assert props["listeners"] == f"http://127.0.0.1:{lay.ports.mirrormaker}"
    assert mm2.argv[mm2.argv.index("-cp") + 1] == f"{jars}/*"
    assert mm2.argv[-2:] == [multiregion.MIRROR_CLASS, str(tmp_path / "mirrormaker" / "mm2.properties")]


def test_mirrormaker_without_its_classpath_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(multiregion.paths, "mirror_classpath_dir", lambda: tmp_path / "none")
    with pytest.raises(StackError) as err:
        multiregion.mirrormaker(StackLayout(tmp_path, PortPlan.free(topology=MULTI))).prepare()
    assert "classpath is missing" in err.value.problem and "setup" in err.value.fix


def test_normalize_reads_the_mirrored_topics_natively_and_in_the_chart(tmp_path, monkeypatch):
    lay = StackLayout(tmp_path, PortPlan.free(topology=MULTI))
    sources = lay.normalize_sources()
    assert sources == [f"{r}.infersight.otlp.{t}" for r in lay.regions for t in ("requests", "metrics")]
    assert StackLayout(tmp_path, PortPlan.free()).normalize_sources() == []
    submitted = {}
    monkeypatch.setattr(jobs, "running_jobs", lambda layout: {})
    monkeypatch.setattr(jobs, "submit", lambda layout, module, args: submitted.setdefault(module, args) and "id")
    jobs.deploy(lay, tmp_path / "archive", log=lambda _: None)
    normalize_args = submitted["infersight.flink_jobs.normalize.job"]
    assert normalize_args[normalize_args.index("--source-topics") + 1] == ",".join(sources)
    assert "--source-topics" not in submitted["infersight.flink_jobs.metrics.job"]
    assert [t.name for t in mirror.NORMALIZE_SOURCES] == ["infersight.otlp.requests", "infersight.otlp.metrics"]


def test_the_global_broker_gets_the_mirrored_topics_with_their_settings():
    topics = {t.name: t for t in mirror.global_topics(("eu-west-1",))}
    for t in mirror.mirrored_topics():
        g = topics[f"eu-west-1.{t.name}"]
        assert (g.partitions, g.retention_ms) == (t.partitions, t.retention_ms)


def test_normalize_takes_a_mirrored_metrics_topic_for_metrics():
    out = list(normalize("eu-west-1.infersight.otlp.metrics", 0, 7, b"\xff\x00garbage", time.time_ns()))
    assert [o[0] for o in out] == [DLQ.name]
    assert "not an OTLP metrics request" in json.loads(out[0][1])["reason"]


# ---- the relay, as a process, against real sockets ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def relay():
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen()

    def echo() -> None:
        while True:
            try:
                conn, _ = upstream.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")],
                             daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    listen, control = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "infersight.stack.relay", "--listen", f"127.0.0.1:{listen}",
                             "--upstream", f"127.0.0.1:{upstream.getsockname()[1]}",
                             "--control", f"127.0.0.1:{control}"])

    def call(action: str = "") -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{control}/{action}", method="POST" if action else "GET")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    deadline = time.monotonic() + 20
    while True:
        try:
            call()
            break
        except OSError:
            assert time.monotonic() < deadline, "the relay did not start"
            time.sleep(0.1)
    try:
        yield listen, call
    finally:
        proc.terminate()
        proc.wait(10)
        upstream.close()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.settimeout(2)
    return s


def test_the_relay_forwards_holds_silently_when_cut_and_delivers_after_the_heal(relay):
    port, call = relay
    with _connect(port) as s:
        s.sendall(b"hello")
        assert s.recv(100) == b"hello"
        assert call("cut")["state"] == "cut"
        s.sendall(b"held")
        with pytest.raises(TimeoutError):  # a blackhole: no answer, no error
            s.recv(100)
        late = _connect(port)  # a new connection is accepted, and nothing comes back on it either
        late.sendall(b"new")
        with pytest.raises(TimeoutError):
            late.recv(100)
        assert call("heal")["state"] == "open"
        assert s.recv(100) == b"held"  # nothing lost: held, as TCP retransmits through a blackhole
        assert late.recv(100) == b"new"
        late.close()
    state = call()
    assert state["bytes_up"] == state["bytes_down"] == len(b"hello" + b"held" + b"new")


def test_the_relay_reset_closes_every_connection_and_refuses_until_healed(relay):
    port, call = relay
    s = _connect(port)
    s.sendall(b"x")
    assert s.recv(10) == b"x"
    assert call("reset")["state"] == "reset"
    try:
        assert s.recv(10) == b""  # closed by the relay
    except ConnectionResetError:
        pass
    s.close()
    with pytest.raises(ConnectionRefusedError):
        _connect(port)
    assert call("heal")["state"] == "open"
    with _connect(port) as again:
        again.sendall(b"y")
        assert again.recv(10) == b"y"


def test_a_link_action_must_be_known(tmp_path):
    with pytest.raises(ValueError, match="unknown link action 'drop'"):
        multiregion.link(StackLayout(tmp_path, PortPlan.free(topology=MULTI)), "us-east-1", "drop")

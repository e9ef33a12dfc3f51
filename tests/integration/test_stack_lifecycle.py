"""The real stack's lifecycle: health, idempotent start, status, and the collector configs."""

from __future__ import annotations

import socket
import subprocess

import pytest

from infersight.schemas.topics import ALL_TOPICS
from infersight.stack import paths
from infersight.stack.kafka_admin import existing_topics

pytestmark = pytest.mark.integration


def test_every_component_is_healthy_and_ours(stack):
    rows = stack.status()
    assert {r.name for r in rows} == {c.name for c in stack.layout.components()}
    for r in rows:
        assert r.running and r.healthy, r
        assert stack.is_ours(r.pid)
        for port in r.ports.values():
            assert stack.layout.ports.host == "127.0.0.1" and port > 1024


def test_project_topics_exist(stack):
    assert {t.name for t in ALL_TOPICS} <= existing_topics(stack.layout.kafka_bootstrap)


def test_starting_twice_is_harmless(stack):
    before = stack.running_components()
    stack.up(timeout=30)
    assert stack.running_components() == before


def listening_sockets(pids: list[int]) -> list[tuple[str, int, str, int]]:
    """(process name, pid, local address, port) of every listening TCP socket and bound UDP socket of the
    processes ``pids`` and all their descendants (Flink's Python workers, the JVMs' helpers)."""
    import psutil  # vLLM's dependency, in the lock: reads /proc, needs no `ss`

    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            procs[proc.pid] = proc
    out = []
    for proc in procs.values():
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:  # a worker that ended meanwhile holds no socket
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr):
                out.append((proc.name(), proc.pid, c.laddr.ip, c.laddr.port))
    return out


def test_every_socket_of_every_stack_process_is_loopback_only(stack):
    """Every listening socket of every process the stack started, planned port or not, binds loopback."""
    pids = list(stack.running_components().values())
    assert len(pids) == len(stack.layout.components())
    sockets = listening_sockets(pids)
    planned = {port for _, port in stack.layout.ports.named()}
    assert planned & {port for *_, port in sockets}, "no planned port found listening: the check saw nothing"
    exposed = [s for s in sockets if s[2] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, f"listening beyond loopback: {exposed}"


@pytest.mark.parametrize("config", ["gateway.yaml", "sink.yaml"])
def test_collector_configs_validate_with_the_built_otelcol(stack, config):
    env = {
        "INFERSIGHT_REGION": "us-east-1", "INFERSIGHT_KAFKA_BROKERS": stack.layout.kafka_bootstrap,
        "INFERSIGHT_OTLP_GRPC_ENDPOINT": "127.0.0.1:1", "INFERSIGHT_OTLP_HTTP_ENDPOINT": "127.0.0.1:2",
        "INFERSIGHT_HEALTH_ENDPOINT": "127.0.0.1:3", "INFERSIGHT_TELEMETRY_HOST": "127.0.0.1",
        "INFERSIGHT_TELEMETRY_PORT": "4", "INFERSIGHT_QUEUE_DIR": "/tmp/infersight-validate",
        "INFERSIGHT_MEMORY_LIMIT_MIB": "128", "INFERSIGHT_PROMETHEUS_URL": "http://127.0.0.1:5",
    }
    out = subprocess.run([str(paths.otelcol_binary()), "validate", f"--config={paths.collector_config(config)}"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_kafka_storage_formats_with_a_cluster_id_that_starts_with_a_dash(tmp_path, monkeypatch):
    """Regression: a base64 cluster id may begin with "-" (1 in 64), which argparse read as an option."""
    import uuid

    from infersight.stack import components
    from infersight.stack.components import StackLayout
    from infersight.stack.ports import PortPlan

    monkeypatch.setattr(components.uuid, "uuid4", lambda: uuid.UUID(bytes=b"\xf8" + bytes(range(15))))
    layout = StackLayout(tmp_path, PortPlan.free())
    layout.kafka().prepare()
    meta = (layout.data / "kafka" / "meta.properties").read_text()
    assert "cluster.id=-" in meta

"""The real stack's lifecycle: health, idempotent start, status, and the collector configs."""

from __future__ import annotations

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


def test_processes_bind_loopback_only(stack):
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("ss is not available")
    pids = set(stack.running_components().values())
    for line in out.stdout.splitlines()[1:]:
        if any(f"pid={pid}," in line for pid in pids) and any(
                f":{p} " in line for _, p in stack.layout.ports.named()):
            local = line.split()[3]
            assert local.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")), line


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

"""docker-compose.yml cannot run here (no Docker engine): validate it statically against the
native stack — every mounted file exists, each service uses the native stack's config file,
and published ports match the native default port plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infersight.stack import paths
from infersight.stack.components import REGIONS, StackLayout
from infersight.stack.ports import PortPlan

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DEFAULT = PortPlan.default()


def mounts(service: dict) -> dict[str, str]:
    """container path -> repo-relative source, for bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            out[target] = source[2:]
    return out


def published(service: dict) -> dict[int, int]:
    """container port -> host port; asserts every binding is loopback-only."""
    out = {}
    for spec in service.get("ports", []):
        host_ip, host, container = spec.split(":")
        assert host_ip == "127.0.0.1", spec
        out[int(container)] = int(host)
    return out


def rel(path: Path) -> str:
    return str(path.resolve().relative_to(REPO))


def test_every_bind_mount_and_build_file_exists():
    for name, service in SERVICES.items():
        for source in mounts(service).values():
            assert (REPO / source).exists(), f"{name}: {source}"
        if "build" in service:
            dockerfile = REPO / service["build"]["context"] / service["build"]["dockerfile"]
            assert dockerfile.is_file()
            for src in re.findall(r"^COPY (.+) \S+$", dockerfile.read_text(), re.M):
                for item in src.split():
                    assert (REPO / item).exists(), item


@pytest.mark.parametrize("index,region", list(enumerate(REGIONS)))
def test_gateways_use_the_native_config_and_ports(index, region):
    service = SERVICES[f"gateway-{region}"]
    assert mounts(service)["/etc/infersight/gateway.yaml"] == rel(paths.collector_config("gateway.yaml"))
    assert service["command"] == ["--config=/etc/infersight/gateway.yaml"]
    env = service["environment"]
    assert env["INFERSIGHT_REGION"] == region
    ports = published(service)
    plan = DEFAULT.gateways[index]
    assert ports[int(env["INFERSIGHT_OTLP_GRPC_ENDPOINT"].rsplit(":", 1)[1])] == plan.otlp_grpc
    assert ports[int(env["INFERSIGHT_OTLP_HTTP_ENDPOINT"].rsplit(":", 1)[1])] == plan.otlp_http
    assert ports[int(env["INFERSIGHT_HEALTH_ENDPOINT"].rsplit(":", 1)[1])] == plan.health


def config_env_vars(config: str) -> set[str]:
    return set(re.findall(r"\$\{env:(\w+)\}", paths.collector_config(config).read_text()))


@pytest.mark.parametrize("service,config", [(f"gateway-{r}", "gateway.yaml") for r in REGIONS]
                         + [("sink", "sink.yaml")])
def test_collector_services_define_every_variable_their_config_reads(service, config):
    assert config_env_vars(config) <= set(SERVICES[service]["environment"])


def test_sink_uses_the_native_config_and_health_port():
    sink = SERVICES["sink"]
    assert mounts(sink)["/etc/infersight/sink.yaml"] == rel(paths.collector_config("sink.yaml"))
    assert published(sink)[13133] == DEFAULT.sink_health
    assert sink["environment"]["INFERSIGHT_PROMETHEUS_URL"] == "http://prometheus:9090"


def test_prometheus_matches_the_native_flags_config_and_port(tmp_path):
    prom = SERVICES["prometheus"]
    layout = StackLayout(tmp_path, DEFAULT)
    native = layout.prometheus().argv
    # the native stack runs a copy of the mounted config with its own rule folder and Alertmanager port
    assert f"--config.file={layout.prometheus_config}" in native
    assert mounts(prom)["/etc/prometheus/prometheus.yml"] == rel(layout.prometheus_base_config)
    assert mounts(prom)["/etc/prometheus/rules"] == rel(paths.resource("infersight.dashboards", "generated/rules"))
    flags = {a.split("=")[0] for a in native[1:]}
    assert flags == {a.split("=")[0] for a in prom["command"]}
    assert "--web.enable-remote-write-receiver" in prom["command"]
    assert published(prom)[9090] == DEFAULT.prometheus


def test_alertmanager_matches_the_native_flags_config_and_port(tmp_path):
    am = SERVICES["alertmanager"]
    native = StackLayout(tmp_path, DEFAULT).alertmanager().argv
    assert {a.split("=")[0] for a in native[1:]} == {a.split("=")[0] for a in am["command"]}
    assert mounts(am)["/etc/alertmanager/alertmanager.yml"] == "dashboards/generated/alertmanager.yml"
    assert published(am)[9093] == DEFAULT.alertmanager
    base = yaml.safe_load(StackLayout(tmp_path, DEFAULT).prometheus_base_config.read_text())
    assert base["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert base["rule_files"] == ["/etc/prometheus/rules/*.yml"]


def test_prometheus_scrapes_every_collectors_telemetry_port(tmp_path):
    base = yaml.safe_load(StackLayout(tmp_path, DEFAULT).prometheus_base_config.read_text())
    (job,) = [j for j in base["scrape_configs"] if j["job_name"] == "otelcol"]
    targets = {t["targets"][0]: t["labels"] for t in job["static_configs"]}
    for region in REGIONS:
        port = SERVICES[f"gateway-{region}"]["environment"]["INFERSIGHT_TELEMETRY_PORT"]
        assert targets[f"gateway-{region}:{port}"] == {"collector": "gateway", "region": region}
    assert targets[f"sink:{SERVICES['sink']['environment']['INFERSIGHT_TELEMETRY_PORT']}"]["collector"] == "sink"
    # the native stack scrapes the same collectors, with the same labels, on its own ports
    layout = StackLayout(tmp_path, DEFAULT)
    layout.write_prometheus_config()
    (native,) = [j for j in yaml.safe_load(layout.prometheus_config.read_text())["scrape_configs"]
                 if j["job_name"] == "otelcol"]
    assert sorted(map(str, (t["labels"] for t in native["static_configs"]))) == sorted(map(str, targets.values()))
    assert {t["targets"][0] for t in native["static_configs"]} == {
        f"127.0.0.1:{p}" for p in (*(g.telemetry for g in DEFAULT.gateways), DEFAULT.sink_telemetry)}


def test_kafka_uses_the_native_server_properties_and_port():
    kafka = SERVICES["kafka"]
    assert mounts(kafka)["/mnt/shared/config/server.properties"] == rel(paths.stack_config("kafka/server.properties"))
    assert published(kafka)[9092] == DEFAULT.kafka
    assert kafka["image"].endswith(":" + paths.KAFKA_VERSION)


def test_flink_uses_the_native_config_module_and_rest_port():
    jm = SERVICES["jobmanager"]
    assert published(jm)[8081] == DEFAULT.flink_rest
    dockerfile = (REPO / jm["build"]["context"] / jm["build"]["dockerfile"]).read_text()
    assert "COPY stack ./stack" in dockerfile  # stack/config/flink/config.yaml travels in
    assert 'ENTRYPOINT ["infersight", "flink-node"]' in dockerfile
    assert SERVICES["taskmanager"]["command"][0] == "taskmanager"


def test_grafana_is_provisioned_with_the_prometheus_datasource():
    grafana = SERVICES["grafana"]
    source = mounts(grafana)["/etc/grafana/provisioning"]
    ds = yaml.safe_load((REPO / source / "datasources" / "prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"

"""Transport security settings -> what the stack runs: collector overlays and their variables, the broker's
properties, the Kafka clients' settings; the default changes nothing. (The integration test
tests/integration/test_transport_security.py runs them.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infersight.flink_jobs.common.kafka_io import parse_properties, sql_client_options
from infersight.stack import paths
from infersight.stack.components import StackLayout
from infersight.stack.errors import StackError
from infersight.stack.ports import PortPlan
from infersight.stack.security import (
    COLLECTOR_ENV,
    FLINK_SHADED_PREFIX,
    GATEWAY_KAFKA_SASL,
    GATEWAY_OTLP_MTLS,
    GATEWAY_OTLP_TLS,
    SINK_KAFKA_SASL,
    TransportSecurity,
    java_properties_text,
)

SECURITY_ENV = ("INFERSIGHT_TLS_DIR", "INFERSIGHT_KAFKA_SASL_USER", "INFERSIGHT_KAFKA_SASL_PASSWORD",
                "INFERSIGHT_KAFKA_SASL_MECHANISM")


@pytest.fixture(autouse=True)
def no_security_env(monkeypatch):
    for var in SECURITY_ENV:
        monkeypatch.delenv(var, raising=False)


def tls_dir(tmp_path: Path, client_ca: bool = True) -> Path:
    d = tmp_path / "tls"
    d.mkdir(parents=True)
    (d / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n")
    (d / "server.pem").write_text("-----BEGIN CERTIFICATE-----\nserver\n-----END CERTIFICATE-----\n")
    (d / "server-key.pem").write_text("-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n")
    if client_ca:
        (d / "client-ca.pem").write_text("-----BEGIN CERTIFICATE-----\nclients\n-----END CERTIFICATE-----\n")
    return d


def secure(tmp_path: Path, client_ca: bool = True, **env: str) -> TransportSecurity:
    return TransportSecurity.from_env({"INFERSIGHT_TLS_DIR": str(tls_dir(tmp_path, client_ca)),
                                       "INFERSIGHT_KAFKA_SASL_USER": "ingest",
                                       "INFERSIGHT_KAFKA_SASL_PASSWORD": "pa+ss/word=", **env})


def config_args(argv: list[str]) -> list[str]:
    return [Path(a.split("=", 1)[1]).name for a in argv if a.startswith("--config=")]


# -- the default: nothing changes ------------------------------------------------------------------------

def test_default_is_no_security_and_changes_no_command_or_environment(tmp_path):
    assert TransportSecurity.from_env({}) == TransportSecurity()
    layout = StackLayout(tmp_path, PortPlan.default())
    assert layout.security == TransportSecurity()
    for c in layout.components():
        if c.name.startswith("gateway") or c.name == "sink":
            assert config_args(c.argv) == ["gateway.yaml" if c.name.startswith("gateway") else "sink.yaml"]
            assert not set(COLLECTOR_ENV) & set(c.env), c.name
    assert layout.otlp_endpoint("us-east-1") == "http://127.0.0.1:4317"
    assert TransportSecurity().librdkafka_config() == {} == TransportSecurity().java_client_properties()
    assert TransportSecurity().scram_format_args() == []


def test_default_broker_keeps_the_plaintext_loopback_listener(tmp_path, monkeypatch):
    layout = StackLayout(tmp_path, PortPlan.free())
    monkeypatch.setattr("infersight.stack.components.subprocess.run", lambda *a, **k: None)
    layout.kafka().prepare()
    conf = (tmp_path / "kafka" / "server.properties").read_text()
    assert f"listeners=PLAINTEXT://127.0.0.1:{layout.ports.kafka}," in conf
    assert "SASL" not in conf and "ssl." not in conf
    assert not (tmp_path / "kafka" / "keystore.pem").exists()


# -- settings ------------------------------------------------------------------------------------------

def test_settings_from_the_environment(tmp_path):
    s = secure(tmp_path)
    assert s.otlp_tls and s.otlp_mtls and s.kafka_sasl
    assert s.sasl_mechanism == "SCRAM-SHA-512"
    assert s.tls_dir == (tmp_path / "tls").resolve()
    only_tls = TransportSecurity.from_env({"INFERSIGHT_TLS_DIR": str(s.tls_dir)})
    assert only_tls.otlp_tls and only_tls.otlp_mtls and not only_tls.kafka_sasl


@pytest.mark.parametrize("env,problem", [
    ({"INFERSIGHT_KAFKA_SASL_USER": "u", "INFERSIGHT_KAFKA_SASL_PASSWORD": "p"}, "without INFERSIGHT_TLS_DIR"),
    ({"INFERSIGHT_KAFKA_SASL_USER": "u"}, "only one of"),
    ({"INFERSIGHT_KAFKA_SASL_PASSWORD": "p"}, "only one of"),
    ({"INFERSIGHT_TLS_DIR": "/nonexistent/tls"}, "lacks ca.pem, server.pem, server-key.pem"),
])
def test_incomplete_settings_are_errors_that_name_the_fix(env, problem):
    with pytest.raises(StackError, match=problem) as err:
        TransportSecurity.from_env(env)
    assert err.value.fix


def test_unsupported_mechanism_and_unsafe_password_are_refused(tmp_path):
    with pytest.raises(StackError, match="PLAIN is not supported"):
        secure(tmp_path, INFERSIGHT_KAFKA_SASL_MECHANISM="plain")
    with pytest.raises(StackError, match="contains"):
        secure(tmp_path / "b", INFERSIGHT_KAFKA_SASL_PASSWORD='a"b')
    assert secure(tmp_path / "c", INFERSIGHT_KAFKA_SASL_MECHANISM="scram-sha-256").sasl_mechanism == "SCRAM-SHA-256"


# -- collectors ----------------------------------------------------------------------------------------

def test_secure_collectors_merge_the_overlays_and_get_their_variables(tmp_path, monkeypatch):
    s = secure(tmp_path)
    layout = StackLayout(tmp_path / "state", PortPlan.free(), security=s)
    gateway = layout.gateway(0, "us-east-1")
    assert config_args(gateway.argv) == ["gateway.yaml", GATEWAY_OTLP_TLS, GATEWAY_OTLP_MTLS, GATEWAY_KAFKA_SASL]
    assert config_args(layout.sink().argv) == ["sink.yaml", SINK_KAFKA_SASL]
    for overlay in config_args(gateway.argv)[1:]:
        assert overlay_vars(overlay) <= set(gateway.env), overlay
        for var in overlay_vars(overlay) - {"INFERSIGHT_KAFKA_SASL_USER", "INFERSIGHT_KAFKA_SASL_PASSWORD",
                                            "INFERSIGHT_KAFKA_SASL_MECHANISM"}:
            assert Path(gateway.env[var]).is_file(), var
    assert overlay_vars(SINK_KAFKA_SASL) <= set(layout.sink().env)
    assert gateway.env["INFERSIGHT_OTLP_TLS_CLIENT_CA"] == str(s.tls_dir / "client-ca.pem")
    assert layout.otlp_endpoint("us-east-1").startswith("https://")
    # TLS without a client CA: TLS, no client certificates asked; Kafka over SASL only when its settings are set
    only_tls = StackLayout(tmp_path / "s2", PortPlan.free(),
                           security=TransportSecurity(tls_dir(tmp_path / "b", client_ca=False)))
    assert config_args(only_tls.gateway(0, "us-east-1").argv) == ["gateway.yaml", GATEWAY_OTLP_TLS]
    assert config_args(only_tls.sink().argv) == ["sink.yaml"]


def overlay(name: str) -> dict:
    return yaml.safe_load(paths.collector_config(name).read_text())


def overlay_vars(name: str) -> set[str]:
    return set(re.findall(r"\$\{env:(\w+)\}", paths.collector_config(name).read_text()))


def test_overlays_name_only_components_of_their_base_config_with_the_verified_keys():
    """Keys as configtls v1.71.0 (core v0.165.0) and contrib configkafka v0.165.1 spell them."""
    gateway, sink = overlay("gateway.yaml"), overlay("sink.yaml")
    for name in (GATEWAY_OTLP_TLS, GATEWAY_OTLP_MTLS):
        protocols = overlay(name)["receivers"]["otlp"]["protocols"]
        assert set(protocols) == set(gateway["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    tls = overlay(GATEWAY_OTLP_TLS)["receivers"]["otlp"]["protocols"]["grpc"]["tls"]
    assert {"cert_file", "key_file"} <= set(tls)
    mtls = overlay(GATEWAY_OTLP_MTLS)["receivers"]["otlp"]["protocols"]["http"]["tls"]
    assert set(mtls) == {"client_ca_file", "client_ca_file_reload"}
    exporters = overlay(GATEWAY_KAFKA_SASL)["exporters"]
    assert set(exporters) == {k for k in gateway["exporters"] if k.startswith("kafka")}
    for client in (*exporters.values(), overlay(SINK_KAFKA_SASL)["receivers"]["kafka"]):
        assert set(client) == {"tls", "auth"}
        assert set(client["auth"]["sasl"]) == {"mechanism", "username", "password"}
        assert "ca_file" in client["tls"]
    assert set(overlay(SINK_KAFKA_SASL)["receivers"]) <= set(sink["receivers"])


# -- the native broker ---------------------------------------------------------------------------------

def test_secure_broker_listens_sasl_ssl_only_and_formats_with_the_scram_user(tmp_path, monkeypatch):
    s = secure(tmp_path)
    layout = StackLayout(tmp_path / "state", PortPlan.free(), security=s)
    calls = []
    monkeypatch.setattr("infersight.stack.components.subprocess.run", lambda argv, **k: calls.append(argv))
    layout.kafka().prepare()
    conf_file = tmp_path / "state" / "kafka" / "server.properties"
    conf = parse_properties(conf_file.read_text())  # last one wins, as in Java
    port, controller = layout.ports.kafka, layout.ports.kafka_controller
    assert conf["listeners"] == f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}"
    assert conf["advertised.listeners"] == f"SASL_SSL://127.0.0.1:{port}"
    assert conf["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
    assert conf["inter.broker.listener.name"] == "SASL_SSL"
    assert conf["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert "ScramLoginModule required" in conf["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    keystore = Path(conf["ssl.keystore.location"])
    assert conf["ssl.keystore.type"] == "PEM" and keystore.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert "BEGIN CERTIFICATE" in keystore.read_text()
    for secret in (conf_file, keystore):
        assert secret.stat().st_mode & 0o077 == 0, secret
    [fmt] = calls
    assert fmt[fmt.index("--add-scram") + 1] == "SCRAM-SHA-512=[name=ingest,password=pa+ss/word=]"


def test_a_broker_formatted_without_the_user_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr("infersight.stack.components.subprocess.run", lambda *a, **k: None)
    state = tmp_path / "state"
    (state / "data" / "kafka").mkdir(parents=True)
    (state / "data" / "kafka" / "meta.properties").write_text("formatted without SCRAM\n")
    layout = StackLayout(state, PortPlan.free(), security=secure(tmp_path))
    with pytest.raises(StackError, match="without the SASL user 'ingest'") as err:
        layout.kafka().prepare()
    assert "--wipe" in err.value.fix


def test_a_key_kafka_cannot_read_is_an_error_naming_the_conversion(tmp_path):
    s = secure(tmp_path)
    s.server_key.write_text("-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n")
    with pytest.raises(StackError, match="PKCS#8") as err:
        s.keystore_pem()
    assert "openssl pkcs8 -topk8 -nocrypt" in err.value.fix


# -- Kafka clients ----------------------------------------------------------------------------------------

def test_librdkafka_settings_are_accepted_by_confluent_kafka(tmp_path):
    from confluent_kafka.admin import AdminClient

    conf = secure(tmp_path).librdkafka_config()
    assert conf == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "ingest",
                    "sasl.password": "pa+ss/word=", "ssl.ca.location": str((tmp_path / "tls" / "ca.pem").resolve())}
    AdminClient({"bootstrap.servers": "127.0.0.1:1", **{**conf, "ssl.ca.location": "probe"}})  # keys known


def test_flink_client_properties_use_the_connectors_relocated_login_module(tmp_path):
    s = secure(tmp_path)
    props = s.java_client_properties()
    assert props["security.protocol"] == "SASL_SSL" and props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["sasl.jaas.config"].startswith(FLINK_SHADED_PREFIX + "org.apache.kafka.common.security.scram.")
    assert not s.java_client_properties(shaded=False)["sasl.jaas.config"].startswith(FLINK_SHADED_PREFIX)
    assert props["ssl.truststore.type"] == "PEM" and props["ssl.truststore.location"] == str(s.ca)
    # what the stack writes, the jobs read back unchanged
    assert parse_properties(java_properties_text(props)) == props


def test_jobs_get_the_properties_file_only_when_kafka_security_is_on(tmp_path, monkeypatch):
    from infersight.flink_jobs.common import kafka_io
    from infersight.stack import jobs

    s = secure(tmp_path)
    layout = StackLayout(tmp_path / "state", PortPlan.free(), security=s)
    written = jobs.kafka_client_properties_file(layout)
    assert written.stat().st_mode & 0o077 == 0
    monkeypatch.setenv(kafka_io.KAFKA_PROPERTIES_ENV, str(written))
    assert kafka_io.client_properties() == s.java_client_properties()
    options = sql_client_options()
    assert ",\n'properties.security.protocol' = 'SASL_SSL'" in options
    assert "'properties.sasl.jaas.config' = '" + FLINK_SHADED_PREFIX in options
    monkeypatch.delenv(kafka_io.KAFKA_PROPERTIES_ENV)
    assert kafka_io.client_properties() == {} and sql_client_options() == ""


def test_properties_parser_and_sql_quoting():
    assert parse_properties("# c\n! c\n\na=b=c\nd : e\n") == {"a": "b=c", "d": "e"}
    with pytest.raises(ValueError, match="not a key=value line"):
        parse_properties("orphan\n")
    assert sql_client_options({"k": "it's"}) == ",\n'properties.k' = 'it''s'"


# -- docker-compose.tls.yml (static: no Docker engine here) ------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
TLS = yaml.safe_load((REPO / "docker-compose.tls.yml").read_text())["services"]
TLS_TARGET = "/etc/infersight/tls"


def binds(service: dict) -> dict[str, str]:
    """container path -> source, for the override's bind mounts."""
    return {v.split(":")[-2]: v.rsplit(":", 2)[0] for v in service.get("volumes", [])}


def test_compose_override_only_adds_to_services_of_the_base_file_and_publishes_nothing():
    assert set(TLS) <= set(BASE)
    for name, service in TLS.items():
        assert "ports" not in service, name  # published ports stay the base file's (127.0.0.1 only)
        for target, source in binds(service).items():
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name}: {source}"
            else:
                assert target == TLS_TARGET and source.startswith("${INFERSIGHT_TLS_DIR:?"), f"{name}: {source}"


@pytest.mark.parametrize("name", [n for n in TLS if n.startswith("gateway-")] + ["sink"])
def test_compose_collectors_merge_the_same_overlays_with_every_variable_they_read(name):
    service, base = TLS[name], BASE[name]
    configs = [a.split("=", 1)[1] for a in service["command"]]
    assert configs[0] == base["command"][0].split("=", 1)[1]  # the base config first, as natively
    # the compose override is the full mode (its TLS dir must hold client-ca.pem): every overlay of the role
    expected = [GATEWAY_OTLP_TLS, GATEWAY_OTLP_MTLS, GATEWAY_KAFKA_SASL] if name.startswith("gateway-") \
        else [SINK_KAFKA_SASL]
    assert [Path(c).name for c in configs[1:]] == expected
    mounted = binds(service)
    for config in configs[1:]:
        assert Path(mounted[config]).resolve() == paths.collector_config(Path(config).name).resolve()
    env = {**base["environment"], **service["environment"]}
    for config in configs[1:]:
        assert overlay_vars(Path(config).name) <= set(env), config
    for var in ("INFERSIGHT_OTLP_TLS_CERT", "INFERSIGHT_OTLP_TLS_KEY", "INFERSIGHT_OTLP_TLS_CLIENT_CA",
                "INFERSIGHT_KAFKA_TLS_CA"):
        if var in env:
            assert env[var].startswith(TLS_TARGET + "/"), var
    assert env["INFERSIGHT_KAFKA_BROKERS"] == "kafka:19092"


def test_compose_kafka_runs_the_secure_script_and_is_health_checked_over_sasl_ssl():
    kafka = TLS["kafka"]
    script_target = kafka["entrypoint"][-1]
    script = REPO / binds(kafka)[script_target]
    assert script == REPO / "stack" / "docker" / "kafka-secure.sh"
    assert "--command-config /tmp/infersight-kafka/client.properties" in kafka["healthcheck"]["test"][-1]
    text = script.read_text()
    # the same broker settings as the native stack's (listener names differ: INTERNAL/EXTERNAL)
    native = TransportSecurity(Path("/x"), "u", "p").broker_overrides("h", 1, 2, Path("/k"))
    for line in native:
        key = line.split("=", 1)[0]
        if not key.startswith(("listener", "advertised.listeners", "inter.broker")):
            assert f"\n{key}=" in text, key
    assert "SASL_SSL" in text and "--add-scram" in text and "transaction.version=1" in text
    assert "CONTROLLER://127.0.0.1:9093" in text  # the controller is not on the network
    import subprocess

    subprocess.run(["bash", "-n", str(script)], check=True)
    topics = TLS["topics"]["environment"]
    assert {"INFERSIGHT_TLS_DIR", "INFERSIGHT_KAFKA_SASL_USER", "INFERSIGHT_KAFKA_SASL_PASSWORD"} <= set(topics)

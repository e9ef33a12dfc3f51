"""The Helm charts, offline: deploy/check.py (helm lint/template, every object against a real schema, none
skipped) and the rendered objects against the Python they come from. No cluster runs here: nothing is
scheduled; the tools are pinned and cached (the first run installs them: minutes; warm: seconds)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infersight.schemas import region_status as RS
from infersight.schemas.topics import ALL_TOPICS
from infersight.stack import chart_files, flink_config, jobs, mirror, paths
from infersight.stack.region_status_service import MODULE as REGION_STATUS_MODULE
from infersight.stack.region_status_service import service_args

ROOT = Path(__file__).resolve().parents[2]
REGION = ROOT / "deploy" / "helm" / "infersight-region"
GLOBAL = ROOT / "deploy" / "helm" / "infersight-global"


def _check_module():
    spec = importlib.util.spec_from_file_location("deploy_check", ROOT / "deploy" / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _check_module()


@pytest.fixture(scope="module")
def tools():
    return check.ensure_tools()


def _render(tools, chart: Path, values: Path) -> list[dict]:
    return check.render(tools["helm"], chart, values)


def _values(values: Path) -> dict:
    return yaml.safe_load(values.read_text())


def _of(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _cases(chart: Path) -> list[Path]:
    return sorted((chart / "ci").glob("*-values.yaml"))


def test_the_check_validates_every_object_of_every_ci_values_file_and_skips_none(tools):
    proc = subprocess.run([sys.executable, str(ROOT / "deploy" / "check.py")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(check.REPORT.read_text())
    assert report["skipped"] == 0 and report["problems"] == []
    assert report["objects"] == report["schema_validated"] > 0
    not_for_server = sum(report["kinds"][k] for k in check.PROMETHEUS_OPERATOR_KINDS)
    assert report["server_dry_run_accepted"] == report["objects"] - not_for_server
    for kind in ("StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap", "Deployment", "Kafka",
                 "KafkaNodePool", "KafkaTopic", "KafkaMirrorMaker2", "FlinkDeployment", "PrometheusRule",
                 "ServiceMonitor", "PodMonitor"):
        assert report["kinds"].get(kind, 0) > 0, kind
    assert report["kubernetes_versions"] == list(check.KUBERNETES_VERSIONS)
    assert set(report["schema_sources"]) >= {"core", "strimzi", "FlinkDeployment", "prometheus-operator"}


def test_a_schema_violation_is_caught_not_skipped(tools):
    objects = _render(tools, GLOBAL, _cases(GLOBAL)[0])
    mm2 = _of(objects, "KafkaMirrorMaker2")[0]
    mm2["spec"]["mirrors"][0]["topicPattern"] = "x"  # an unknown field (the field is topicsPattern)
    flink = _of(objects, "FlinkDeployment")[0]
    flink["spec"]["job"]["upgradeMode"] = "lastState"  # not in the enum
    sts_objects = _render(tools, REGION, _cases(REGION)[0])
    sts = _of(sts_objects, "StatefulSet")[0]
    sts["spec"]["replicas"] = "2"
    problems, skipped = check.kubeconform(tools, [mm2, flink, sts], check.KUBERNETES_VERSIONS[-1])
    assert skipped == 0
    text = "\n".join(problems)
    assert "topicPattern" in text and "upgradeMode" in text and "replicas" in text, text
    monitor = _of(objects, "ServiceMonitor")[0]
    monitor["spec"]["endpoints"] = "metrics"
    assert check.prometheus_operator(tools, [monitor]), "the npm validator accepted a string endpoints"


@pytest.mark.parametrize("values", _cases(REGION), ids=lambda p: p.name)
def test_region_chart_carries_the_gateway_config_and_the_topics_themselves(tools, values):
    objects = _render(tools, REGION, values)
    config = next(o for o in _of(objects, "ConfigMap") if o["metadata"]["name"].endswith("-gateway"))
    assert config["data"]["gateway.yaml"] == (ROOT / "collectors" / "gateway.yaml").read_text()
    topics = {o["spec"]["topicName"]: o["spec"] for o in _of(objects, "KafkaTopic")}
    assert set(topics) == {t.name for t in mirror.mirrored_topics()}
    for t in mirror.mirrored_topics():
        assert topics[t.name]["partitions"] == t.partitions
        assert topics[t.name]["config"] == t.config()
    sts = _of(objects, "StatefulSet")[0]
    env = {e["name"]: e["value"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["INFERSIGHT_REGION"] == _values(values)["region"]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "queue"


@pytest.mark.parametrize("values", _cases(GLOBAL), ids=lambda p: p.name)
def test_global_chart_matches_the_python_it_comes_from(tools, values):
    v = _values(values)
    objects = _render(tools, GLOBAL, values)
    bootstrap = "infersight-global-kafka-kafka-bootstrap:9092"
    rf = v.get("kafka", {}).get("replicationFactor", 3)
    # MirrorMaker 2: the Python description's spec
    mm2 = _of(objects, "KafkaMirrorMaker2")[0]["spec"]
    mm2.pop("resources")
    expected = mirror.Mirror(tuple(v["regions"]), replication_factor=rf).strimzi_spec(
        {**v["regionBootstrapServers"], mirror.GLOBAL_ALIAS: bootstrap},
        version=v.get("kafka", {}).get("version", "4.3.1"), ca_secrets=_ca_secrets(v))
    assert mm2 == expected
    # topics: the jobs' own and each region's mirrored ones, as schemas/topics.py gives them
    topics = {o["spec"]["topicName"]: o["spec"] for o in _of(objects, "KafkaTopic")}
    mirrored = mirror.mirrored_topics()
    want = {t.name: t for t in ALL_TOPICS if t not in mirrored}
    want |= {mirror.global_topic(r, t): t for r in v["regions"] for t in mirrored}
    assert set(topics) == set(want)
    for name, t in want.items():
        assert (topics[name]["partitions"], topics[name]["config"]) == (t.partitions, t.config())
    # jobs: the arguments of the native submission, with the mirrored OTLP topics
    deployments = {o["metadata"]["name"]: o["spec"] for o in _of(objects, "FlinkDeployment")}
    assert list(deployments) == list(jobs.JOBS)
    jars = ";".join(f"file:///opt/flink/usrlib/{j.name}" for j in paths.flink_job_jars())
    sources = [f"{r}.{t}" for r in v["regions"] for t in ("infersight.otlp.requests", "infersight.otlp.metrics")]
    for name, module in jobs.JOBS.items():
        spec = deployments[name]
        assert spec["job"]["entryClass"] == "org.apache.flink.client.python.PythonDriver"
        assert spec["job"]["upgradeMode"] == "last-state"
        assert spec["job"]["args"] == ["-pym", module, *jobs.job_args(name, bootstrap, v["flink"]["archiveRoot"],
                                                                      sources), "--jars", jars]
        assert spec["flinkConfiguration"]["execution.checkpointing.dir"].startswith(v["flink"]["checkpointStorage"])
        assert spec["jobManager"]["resource"] and spec["taskManager"]["resource"]
        reporter = flink_config.metrics_reporter(chart_files.SINK_OTLP)  # Flink's metrics as natively
        assert {k: spec["flinkConfiguration"][k] for k in reporter} == reporter
    sink = next(o for o in _of(objects, "ConfigMap") if o["metadata"]["name"] == "infersight-sink")
    assert sink["data"]["sink.yaml"] == (ROOT / "collectors" / "sink.yaml").read_text()
    rules = {o["metadata"]["name"]: o["spec"] for o in _of(objects, "PrometheusRule")}
    for f in sorted((ROOT / "dashboards/generated/rules").glob("*.rules.yml")):
        assert rules[f"infersight-{f.name.removesuffix('.rules.yml')}"] == yaml.safe_load(f.read_text())
    dashboards = [o for o in _of(objects, "ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {p.name for p in (ROOT / "dashboards/generated").glob("*.json")}
    assert {k for d in dashboards for k in d["data"]} == shipped


def _ca_secrets(v: dict) -> dict[str, str]:
    """Each region's CA Secret, as values.yaml documents the name (the region chart's mirror listener is TLS)."""
    defaults = yaml.safe_load((GLOBAL / "values.yaml").read_text())["regionTls"]
    prefix = v.get("regionTls", {}).get("caSecretPrefix", defaults["caSecretPrefix"])
    return {r: f"{prefix}{r}" for r in v["regions"]}


def _named(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in _of(objects, kind) if o["metadata"]["name"] == name)


@pytest.mark.parametrize("values", _cases(GLOBAL), ids=lambda p: p.name)
def test_global_chart_runs_the_region_status_service_as_the_native_stack_does(tools, values):
    v = _values(values)
    objects = _render(tools, GLOBAL, values)
    defaults = yaml.safe_load((GLOBAL / "values.yaml").read_text())["regionStatus"]
    port = v.get("regionStatus", {}).get("port", defaults["port"])
    deployment = _named(objects, "Deployment", "infersight-region-status")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "{repository}:{tag}".format(**v["flink"]["image"])  # the job image: it has the package
    # the native stack's arguments (service_args), each region as the KafkaMirrorMaker2's mirrors reach it
    mm2 = _of(objects, "KafkaMirrorMaker2")[0]["spec"]
    links = {m["source"]["alias"]: m["source"]["bootstrapServers"] for m in mm2["mirrors"]}
    assert links == {r: v["regionBootstrapServers"][r] for r in v["regions"]}
    # each region's link verified against the CA Secret MM2 trusts, mounted where the service is told to read it
    trusted = {m["source"]["alias"]: m["source"]["tls"]["trustedCertificates"] for m in mm2["mirrors"]}
    assert trusted == {r: [{"secretName": s, "certificate": "ca.crt"}] for r, s in _ca_secrets(v).items()}
    pod = deployment["spec"]["template"]["spec"]
    secret_of = {vol["name"]: vol["secret"]["secretName"] for vol in pod["volumes"]}
    cas = {}
    for mount in c["volumeMounts"]:
        region = next(r for r, s in _ca_secrets(v).items() if s == secret_of[mount["name"]])
        cas[region] = f"{mount['mountPath']}/ca.crt"
    assert set(cas) == set(v["regions"]) and all(m["readOnly"] for m in c["volumeMounts"])
    assert c["command"] + c["args"] == [
        "python", "-m", REGION_STATUS_MODULE,
        *service_args("infersight-global-kafka-kafka-bootstrap:9092", links, "0.0.0.0", port,
                      offsets_topic=mm2["target"]["offsetStorageTopic"], cas=cas)]
    assert mm2["target"]["offsetStorageTopic"] == mirror.OFFSET_STORAGE_TOPIC
    # probes on its health endpoint, requests and limits, not root
    assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # scraped every 5 s as job region_status (kube-prometheus-stack: the Service label named by jobLabel)
    service = _named(objects, "Service", "infersight-region-status")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    monitor = _named(objects, "ServiceMonitor", "infersight-region-status")["spec"]
    assert service["metadata"]["labels"][monitor["jobLabel"]] == RS.REGION_STATUS_JOB
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "5s")
    assert service["spec"]["ports"][0]["name"] == "http" and service["spec"]["ports"][0]["port"] == port
    # its alert rules are in the chart's PrometheusRule, from the generated file
    rules = _named(objects, "PrometheusRule", "infersight-regions")["spec"]
    assert rules == yaml.safe_load((ROOT / "dashboards/generated/rules/regions.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"InfersightRegionTelemetryDelayed", "InfersightRegionDown"} <= alerts


def test_the_region_status_service_can_be_switched_off(tools):
    objects = _render(tools, GLOBAL, _cases(GLOBAL)[0])
    off = check.render(tools["helm"], GLOBAL, _cases(GLOBAL)[0], ["--set", "regionStatus.enabled=false"])
    named = {(o["kind"], o["metadata"]["name"]) for o in objects}
    gone = named - {(o["kind"], o["metadata"]["name"]) for o in off}
    assert gone == {(k, "infersight-region-status") for k in ("Deployment", "Service", "ServiceMonitor")}


@pytest.mark.parametrize("chart", [REGION, GLOBAL], ids=lambda p: p.name)
def test_every_container_has_requests_limits_and_probes(tools, chart):
    for values in _cases(chart):
        for o in _render(tools, chart, values):
            if o["kind"] not in ("StatefulSet", "Deployment"):
                continue
            for c in o["spec"]["template"]["spec"]["containers"]:
                where = f"{values.name} {o['kind']}/{o['metadata']['name']} {c['name']}"
                assert c["resources"]["requests"] and c["resources"]["limits"], where
                assert c["readinessProbe"] and c["livenessProbe"], where


BAD = [
    (REGION, ["--set", "region=EU_West"], "EU_West"),
    (REGION, ["--set", "kafka.version=3.9.0"], "/kafka/version"),
    (REGION, ["--set", "gateway.image.repository="], "/gateway/image/repository"),
    (REGION, ["--set", "kafka.storage.storageClass="], "/kafka/storage/storageClass"),
    (GLOBAL, ["--set", "regions={eu-west-1,eu-west-1}"], "/regions"),
    (GLOBAL, ["--set", "regions={eu-west-1,us-east-1}"], 'regionBootstrapServers has no entry for region "us-east-1"'),
    (GLOBAL, ["--set", "flink.checkpointStorage="], "/flink/checkpointStorage"),
    (GLOBAL, ["--set", "regionStatus.port=0"], "/regionStatus/port"),
    (GLOBAL, ["--set", "regionTls.caSecretPrefix=Region_CA"], "/regionTls/caSecretPrefix"),
]


@pytest.mark.parametrize("chart, extra, message", BAD, ids=lambda x: str(x)[-40:])
def test_bad_values_are_refused_with_a_message_naming_the_value(tools, chart, extra, message):
    values = _cases(chart)[0]
    with pytest.raises(check.CheckFailed, match=None) as err:
        check.render(tools["helm"], chart, values, extra)
    assert message in str(err.value), str(err.value)[-1500:]


def test_the_flink_crd_checked_against_is_the_operator_jars_with_only_flink_version_widened(tools):
    original = check.flink_crd_from_jar(check.ensure_jars())
    widened = yaml.safe_load((tools["crds"] / "crds" / "FlinkDeployment.yaml").read_text())
    for v in widened["spec"]["versions"]:
        enum = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["flinkVersion"]["enum"]
        assert enum[-1] == check.FLINK_VERSION_ENUM_ADD and check.FLINK_VERSION_ENUM_ADD not in enum[:-1]
        enum.pop()
    assert widened == original


def test_the_api_server_refuses_what_a_cluster_would(tools):
    objects = _render(tools, GLOBAL, _cases(GLOBAL)[0])
    mm2 = _of(objects, "KafkaMirrorMaker2")[0]
    mm2["spec"]["mirrors"][0]["topicPattern"] = "x"
    flink = _of(objects, "FlinkDeployment")[0]
    flink["spec"]["job"]["upgradeMode"] = "lastState"
    sts = _of(_render(tools, REGION, _cases(REGION)[0]), "StatefulSet")[0]
    sts["spec"]["replicas"] = "2"
    good = _of(objects, "Deployment")[0]
    accepted, problems = check.server_dry_run(tools, [("bad", [mm2, flink, sts, good])])
    assert accepted == 1, problems
    text = "\n".join(problems)
    assert "topicPattern" in text and "lastState" in text and "replicas" in text, text

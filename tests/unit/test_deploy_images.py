"""The charts' Dockerfiles (images cannot be built here): checked statically against the versions the
project locks (requirements.lock, bin/infersight, stack/pom.xml, collectors/builder-config.yaml), and the
widened Flink CRD of deploy/check.py changes nothing but flinkVersion's enum."""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from infersight.stack import paths

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def _locked(name: str) -> str:
    m = re.search(rf"^{re.escape(name)}==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    assert m, f"{name} is not in requirements.lock"
    return m.group(1)


def _check_module():
    spec = importlib.util.spec_from_file_location("deploy_check", ROOT / "deploy" / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_job_image_is_the_official_flink_of_the_locked_pyflink_with_python_311_and_the_locked_wheels():
    text = (DOCKER / "job.Dockerfile").read_text()
    flink = _locked("apache-flink")
    assert re.search(rf"^FROM flink:{re.escape(flink)}-scala_2\.12-java17$", text, re.M), flink
    uv = re.search(r'^UV_VERSION="(\S+)"', (ROOT / "bin" / "infersight").read_text(), re.M).group(1)
    assert f"ghcr.io/astral-sh/uv:{uv} " in text
    assert "uv python install 3.11" in text and "--python 3.11" in text
    assert '-c requirements.lock --override requirements/overrides.txt ".[pipeline]"' in text
    # the jars come from stack/pom.xml through the stack's own set-up, into the path the chart's --jars names
    assert "infersight setup --only jars" in text and "COPY stack ./stack" in text
    assert "/opt/flink/usrlib" in text
    jobs = yaml.safe_load((ROOT / "deploy/helm/infersight-global/files/jobs.yaml").read_text())
    assert jobs["pythonJar"] == f"local:///opt/flink/opt/flink-python-{flink}.jar"


def test_the_jobs_jars_are_the_pom_versions():
    pom = (ROOT / "stack" / "pom.xml").read_text()
    connector = re.search(r"<flink.kafka.connector.version>(.+)</", pom).group(1)
    zstd = re.search(r"<zstd.version>(.+)</", pom).group(1)
    jobs = yaml.safe_load((ROOT / "deploy/helm/infersight-global/files/jobs.yaml").read_text())
    assert f"flink-sql-connector-kafka-{connector}.jar" in jobs["jars"]
    assert f"zstd-jni-{zstd}.jar" in jobs["jars"]
    assert paths.watermarks_jar().name in jobs["jars"]


def test_gateway_image_builds_the_builder_manifest_with_the_stacks_builder_version():
    text = (DOCKER / "gateway.Dockerfile").read_text()
    manifest = yaml.safe_load((ROOT / "collectors" / "builder-config.yaml").read_text())
    assert f"go.opentelemetry.io/collector/cmd/builder@{paths.OTELCOL_BUILDER_VERSION}" in text
    assert f"v{manifest['dist']['version']}" == paths.OTELCOL_BUILDER_VERSION
    assert "COPY collectors/builder-config.yaml" in text
    assert f"/{manifest['dist']['name']}" in text.split("ENTRYPOINT")[1]


def test_the_flink_crd_is_widened_only_in_flink_versions_enum():
    check = _check_module()
    enum = ["v1_19", "v1_20"]
    crd = {"spec": {"versions": [{"name": "v1beta1", "schema": {"openAPIV3Schema": {"properties": {"spec": {
        "properties": {"flinkVersion": {"enum": enum}, "image": {"type": "string"}}}}}}}]}}
    original = copy.deepcopy(crd)
    widened = check.widen_flink_crd(crd)
    assert crd == original  # not changed in place
    got = widened["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert got["flinkVersion"]["enum"] == [*enum, check.FLINK_VERSION_ENUM_ADD]
    got["flinkVersion"]["enum"] = enum
    assert widened == original


def test_strict_conversion_refuses_unknown_fields_except_where_the_crd_keeps_them():
    check = _check_module()
    schema = check.strict({"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "string"}}},
        "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {}}}})
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["config"]


def test_strict_conversion_leaves_one_of_branches_as_constraints():
    """Strimzi's trusted certificate: ``secretName`` and exactly one of ``certificate``/``pattern``; the branches'
    ``properties`` name what each requires, not the only fields allowed (the API server reads them so)."""
    import jsonschema

    check = _check_module()
    item = check.strict({"type": "object", "required": ["secretName"],
                         "properties": {"secretName": {"type": "string"}, "certificate": {"type": "string"},
                                        "pattern": {"type": "string"}},
                         "oneOf": [{"properties": {"certificate": {}}, "required": ["certificate"]},
                                   {"properties": {"pattern": {}}, "required": ["pattern"]}]})
    jsonschema.validate({"secretName": "ca", "certificate": "ca.crt"}, item)
    jsonschema.validate({"secretName": "ca", "pattern": "*.crt"}, item)
    for bad in ({"secretName": "ca"}, {"secretName": "ca", "certificate": "a", "pattern": "b"},
                {"secretName": "ca", "certificate": "a", "other": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, item)

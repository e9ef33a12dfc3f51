"""Port plans, config consistency and set-up error messages of the local stack."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from infersight.schemas import attributes as A
from infersight.schemas.topics import ALL_TOPICS, METRICS, OTLP_METRICS, OTLP_REQUESTS, OTLP_SPANS
from infersight.stack import paths, setup
from infersight.stack.components import StackLayout
from infersight.stack.errors import StackError
from infersight.stack.flink_config import flatten_yaml
from infersight.stack.ports import PortPlan, port_in_use
from infersight.stack.supervisor import Stack


def all_ports(plan: PortPlan) -> list[int]:
    return [p for _, p in plan.named()]


@pytest.mark.parametrize("plan", [PortPlan.default(), PortPlan.from_base(20000), PortPlan.free()])
def test_port_plans_have_distinct_ports(plan):
    ports = all_ports(plan)
    assert len(ports) == len(set(ports)) == 11 + 5 * 3  # Kafka x2 ... the verdict service, gateways (5 each)
    assert plan.host == "127.0.0.1"


def test_two_stacks_from_different_bases_never_collide():
    a, b = PortPlan.from_base(20000), PortPlan.from_base(20100)
    assert not set(all_ports(a)) & set(all_ports(b))
    assert not set(all_ports(a)) & set(all_ports(PortPlan.default()))


def test_port_plan_round_trips_through_state():
    plan = PortPlan.free()
    assert PortPlan.from_dict(plan.to_dict()) == plan


def test_bad_base_port_is_a_clear_error():
    with pytest.raises(StackError, match="base port 80"):
        PortPlan.from_base(80)


def test_port_in_use_detects_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use("127.0.0.1", s.getsockname()[1])


def test_start_refuses_a_port_in_use_naming_it(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        plan = PortPlan.free()
        plan = PortPlan.from_dict({**plan.to_dict(), "prometheus": busy})
        with pytest.raises(StackError) as err:
            Stack(tmp_path, plan, log=lambda _: None).up(timeout=5)
    assert f"port {busy} (prometheus http)" in err.value.problem
    assert "--base-port" in err.value.fix


def test_a_port_held_for_a_moment_is_waited_for_not_refused(tmp_path):
    """While a component is down its port can serve as some client's local port for an instant (CI: a gateway's
    health port, during a Kafka outage's reconnect storm); starting it again waits that out."""
    import threading

    stack = Stack(tmp_path, PortPlan.free(), log=lambda _: None)
    prometheus = stack.layout.prometheus()
    s = socket.socket()
    s.bind(("127.0.0.1", stack.layout.ports.prometheus))
    s.listen()
    threading.Timer(1.0, s.close).start()
    stack._check_ports_free([prometheus], wait_s=10)  # returns once it is free
    assert not port_in_use("127.0.0.1", stack.layout.ports.prometheus)


def test_stopping_a_stack_that_is_not_running_stops_nothing(tmp_path):
    assert Stack(tmp_path, PortPlan.free(), log=lambda _: None).down() == []


def load(name: str) -> dict:
    return yaml.safe_load(paths.collector_config(name).read_text())


def test_gateway_writes_the_contract_topics_keyed_by_trace():
    cfg = load("gateway.yaml")
    spans, metrics = cfg["exporters"]["kafka/spans"], cfg["exporters"]["kafka/metrics"]
    assert spans["traces"]["topic"] == OTLP_SPANS.name
    assert metrics["metrics"]["topic"] == OTLP_METRICS.name
    assert spans["partition_traces_by_id"] is True
    # request-level spans: one Kafka record per batch (the jobs pay per record, a request is one span)
    assert cfg["exporters"]["kafka/requests"]["partition_traces_by_id"] is False
    for exporter in (spans, metrics):
        assert exporter["traces" if exporter is spans else "metrics"]["encoding"] == "otlp_proto"
        assert exporter["sending_queue"]["storage"] == "file_storage/queue"  # durable
        assert exporter["retry_on_failure"]["max_elapsed_time"] == 0  # never gives up
        assert exporter["producer"]["required_acks"] == -1
    for pipeline in cfg["service"]["pipelines"].values():
        assert pipeline["processors"][0] == "memory_limiter"
        assert "resource/region" in pipeline["processors"]
    region = cfg["processors"]["resource/region"]["attributes"][0]
    assert region["key"] == "cloud.region" and region["action"] == "upsert"


def test_gateway_sends_request_level_spans_to_their_own_topic_and_record_only_roots_nowhere_else():
    cfg = load("gateway.yaml")
    pipes = cfg["service"]["pipelines"]
    assert cfg["exporters"]["kafka/requests"]["traces"]["topic"] == OTLP_REQUESTS.name
    assert pipes["traces/requests"]["exporters"] == ["kafka/requests"]
    assert "filter/request_spans" in pipes["traces/requests"]["processors"]
    assert "filter/record_only" in pipes["traces"]["processors"]
    assert "filter/record_only" not in pipes["traces/requests"]["processors"]
    [condition] = cfg["processors"]["filter/request_spans"]["traces"]["span"]
    for name in (A.E2E, A.VLLM_LATENCY_E2E, "model_name", A.CLIENT_TTFT):  # ours, vLLM's, Triton's; clients' (#22)
        assert f'attributes["{name}"] == nil' in condition
    assert 'name != "gen_ai.evaluation"' in condition  # late judge results ride on these spans (issue #17)
    assert A.RECORD_ONLY in cfg["processors"]["filter/record_only"]["traces"]["span"][0]


def test_gateway_acknowledges_an_export_only_once_it_is_in_the_disk_queue():
    """No batch processor before the exporters: its batch lived in memory, acknowledged to the pods, and a
    kill -9 of the gateway lost it (68 requests at 2,000/s, bench/faults.py). Batches form in the disk queue."""
    cfg = load("gateway.yaml")
    assert "batch" not in cfg.get("processors", {})
    for pipeline in cfg["service"]["pipelines"].values():
        assert not any(p.startswith("batch") for p in pipeline["processors"])
    for name in ("kafka/spans", "kafka/requests", "kafka/metrics"):
        queue = cfg["exporters"][name]["sending_queue"]
        assert queue["storage"] == "file_storage/queue"
        # a batch of request spans is one Kafka record: capped (the producer drops a record over its limit)
        assert queue["batch"]["sizer"] == "items" and queue["batch"]["max_size"] == 2048


def test_sink_skips_messages_prometheus_refuses_for_good_instead_of_stalling():
    marking = load("sink.yaml")["receivers"]["kafka"]["message_marking"]
    assert marking == {"after": True, "on_error": False, "on_permanent_error": True}


def test_sink_reads_the_metrics_topic_into_prometheus():
    cfg = load("sink.yaml")
    assert cfg["receivers"]["kafka"]["metrics"]["topics"] == [METRICS.name]
    assert cfg["receivers"]["kafka"]["initial_offset"] == "earliest"
    assert cfg["service"]["pipelines"]["metrics"]["exporters"] == ["prometheusremotewrite"]


def test_builder_manifest_has_the_required_components():
    manifest = yaml.safe_load(paths.collector_config("builder-config.yaml").read_text())
    mods = " ".join(m["gomod"] for section in ("receivers", "exporters", "processors", "extensions")
                    for m in manifest[section])
    for name in ("otlpreceiver", "kafkareceiver", "kafkaexporter", "prometheusremotewriteexporter",
                 "memorylimiterprocessor", "batchprocessor", "resourceprocessor", "filterprocessor",
                 "filestorage", "healthcheckextension"):
        assert f"/{name} v" in mods, name
    assert all(" v0." in m["gomod"] for section in ("receivers", "exporters") for m in manifest[section])


def test_topics_have_deliberate_partitions_and_retention():
    names = [t.name for t in ALL_TOPICS]
    assert len(names) == len(set(names))
    for t in ALL_TOPICS:
        assert t.partitions >= 1 and t.retention_ms >= 3_600_000
        assert t.config()["retention.ms"] == str(t.retention_ms)


def test_flink_conf_keeps_pyflink_jvm_flags_and_sets_our_ports(tmp_path):
    layout = StackLayout(tmp_path, PortPlan.free())
    layout.write_flink_conf()
    conf = yaml.safe_load((layout.flink_conf_dir / "config.yaml").read_text())
    assert conf["rest.port"] == layout.ports.flink_rest
    assert conf["jobmanager.rpc.port"] == layout.ports.flink_rpc
    assert "--add-opens=java.base/java.util=ALL-UNNAMED" in conf["env.java.opts.all"]
    assert conf["python.executable"] == str(paths.venv_python())
    assert conf["execution.checkpointing.dir"].startswith("file://")


def test_flatten_yaml():
    assert flatten_yaml({"a": {"b": {"c": 1}, "d": "x"}, "e": 2}) == {"a.b.c": 1, "a.d": "x", "e": 2}


def test_python_import_root_exposes_what_the_jobs_import_and_no_more(tmp_path):
    root = StackLayout(tmp_path, PortPlan.free()).python_import_root()
    assert sorted(p.name for p in (root / "infersight").iterdir()) == ["__init__.py", "flink_jobs", "schemas"]
    for component in ("schemas", "flink_jobs"):
        assert (root / "infersight" / component / "__init__.py").is_file()
    for job in ("normalize", "metrics", "archive"):  # the job subpackages come along
        assert (root / "infersight" / "flink_jobs" / job / "job.py").is_file()


def test_setup_failure_from_an_unreachable_registry_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSIGHT_CACHE", str(tmp_path))
    with pytest.raises(StackError) as err:
        setup._run(["bash", "-c", "echo 'Could not transfer artifact x from central'; exit 1"],
                   "Maven download", "generic fix")
    assert "Maven download failed" in err.value.problem
    assert "registry could not be reached" in err.value.fix


def test_missing_tool_is_a_clear_error():
    with pytest.raises(StackError, match="`no-such-tool-xyz` is not installed"):
        setup._require("no-such-tool-xyz", "install it")


def test_full_disk_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERSIGHT_CACHE", str(tmp_path))
    monkeypatch.setattr(setup.shutil, "disk_usage", lambda _: type("U", (), {"free": 2**20})())
    with pytest.raises(StackError, match="GiB free"):
        setup._check_disk()


def test_cli_reports_errors_without_a_traceback(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "infersight.cli", "down", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "not running; nothing to stop" in out.stdout
    out = subprocess.run([sys.executable, "-m", "infersight.cli", "status", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "is not running" in out.stdout
    out = subprocess.run([sys.executable, "-m", "infersight.cli", "up", "--state-dir", str(tmp_path),
                          "--base-port", "80"], capture_output=True, text=True,
                         env={**__import__("os").environ, "INFERSIGHT_CACHE": str(paths.cache_dir())})
    assert out.returncode == 1
    assert out.stderr.startswith("error: base port 80") and "Traceback" not in out.stderr
    assert Path(tmp_path).exists()


def test_latest_checkpoint_is_the_newest_complete_one_on_disk_not_the_stale_rest_answer(tmp_path):
    """Right after a cancel Flink's REST cache can still name a checkpoint its successor deleted (CI: restoring
    it failed the submission); the newest one with its _metadata on disk wins."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from types import SimpleNamespace

    from infersight.stack import jobs

    job = "ab" * 16
    root = tmp_path / "flink" / "checkpoints" / job
    for n, complete in ((136, True), (138, True), (139, False)):  # 139: still being written
        (root / f"chk-{n}").mkdir(parents=True)
        if complete:
            (root / f"chk-{n}" / "_metadata").write_bytes(b"x")
    stale = {"latest": {"completed": {"id": 137, "external_path": f"file:{root}/chk-137"}}}

    class Rest(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(stale).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Rest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert jobs.latest_checkpoint(SimpleNamespace(flink_rest_url=url, data=tmp_path), job) == \
            (root / "chk-138").as_uri()
        # no checkpoints on this machine (a containerised cluster): the REST answer
        assert jobs.latest_checkpoint(SimpleNamespace(flink_rest_url=url), job) == f"file:{root}/chk-137"
    finally:
        server.shutdown()


def test_the_demo_submits_its_quality_job_with_a_reference_baseline_and_the_others_as_usual(tmp_path, monkeypatch):
    import argparse

    from infersight import demo
    from infersight.flink_jobs.quality.job import engine_params
    from infersight.stack import jobs

    submitted = {}
    monkeypatch.setattr(jobs, "running_jobs", lambda layout: {})
    monkeypatch.setattr(jobs, "submit", lambda layout, module, args: submitted.setdefault(module, args) and "id")
    lay = StackLayout(tmp_path, PortPlan.free())
    jobs.deploy(lay, tmp_path / "archive", log=lambda _: None, extra_args=demo.DEMO_JOB_ARGS)
    for name, module in jobs.JOBS.items():
        expected = jobs.job_args(name, lay.kafka_bootstrap, str(tmp_path / "archive"))
        assert submitted[module] == [*expected, *demo.DEMO_JOB_ARGS.get(name, [])]
    quality = submitted[jobs.JOBS["infersight-quality"]]
    args = argparse.Namespace(baseline=quality[quality.index("--baseline") + 1], day_bucket_s=900, max_series=200,
                              reference_s=int(quality[quality.index("--reference-s") + 1]))
    params = engine_params(args)
    assert params.baseline == "reference" and params.drift.reference_s == 180


def test_deploy_only_submits_the_named_jobs_that_are_not_running(tmp_path, monkeypatch):
    from infersight.stack import jobs

    submitted = []
    monkeypatch.setattr(jobs, "running_jobs", lambda layout: {"infersight-normalize": "running-id"})
    monkeypatch.setattr(jobs, "submit", lambda layout, module, args: submitted.append(module) or f"id-{module}")
    lay = StackLayout(tmp_path, PortPlan.free())
    ids = jobs.deploy(lay, tmp_path / "archive", log=lambda _: None,
                      only=("infersight-normalize", "infersight-metrics"))
    assert submitted == [jobs.JOBS["infersight-metrics"]]
    assert ids == {"infersight-normalize": "running-id",
                   "infersight-metrics": f"id-{jobs.JOBS['infersight-metrics']}"}

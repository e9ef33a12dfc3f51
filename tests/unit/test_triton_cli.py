"""Zero-code: the real `opentelemetry-instrument` CLI instruments a plain tritonclient script (no OTel code in it)
through our `opentelemetry_instrumentor` entry point; the exporter is chosen by OTEL_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.support.kserve_standin import GrpcStandIn, HttpStandIn

VENV_BIN = Path(sys.executable).parent
SCRIPT = """
import sys
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

http_url, grpc_url = sys.argv[1], sys.argv[2]
for module, url in ((httpclient, http_url), (grpcclient, grpc_url)):
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    print("RESULT", module.__name__, client.infer("echo", [tensor]).as_numpy("OUTPUT0").tolist(), flush=True)
    client.close()
"""


def test_entry_points_are_registered():
    names = {ep.name: ep.value for ep in entry_points(group="opentelemetry_instrumentor")}
    assert names["infersight_triton"].endswith(":TritonClientInstrumentor")
    assert names["infersight_torch_compile"].endswith(":TorchCompileInstrumentor")


def _console_spans(stdout: str) -> list[dict]:
    """The console exporter prints one indented JSON object per span."""
    spans, depth, buf = [], 0, []
    for line in stdout.splitlines():
        if depth == 0 and line.startswith("{"):
            buf = []
        if depth or line.startswith("{"):
            buf.append(line)
            depth += line.count("{") - line.count("}")
            if depth == 0:
                spans.append(json.loads("\n".join(buf)))
    return spans


@pytest.mark.parametrize("disabled", ["", "infersight_triton"])
def test_opentelemetry_instrument_propagates_from_an_unmodified_script(tmp_path, disabled):
    script = tmp_path / "client.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none",
           "OTEL_LOGS_EXPORTER": "none", "OTEL_SERVICE_NAME": "triton-client-test",
           "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": ",".join(filter(None, [disabled, "infersight_vllm"]))}
    with HttpStandIn() as http_server, GrpcStandIn() as grpc_server:
        proc = subprocess.run([str(VENV_BIN / "opentelemetry-instrument"), sys.executable, str(script),
                               http_server.url, grpc_server.url], env=env, capture_output=True, text=True,
                              timeout=120)
        http_received = [h for h in http_server.received if h[":path"].endswith("/infer")]
        grpc_received = [h for h in grpc_server.received if h[":method"] == "ModelInfer"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("RESULT") == 2 and "[1, 2]" in proc.stdout
    spans = [s for s in _console_spans(proc.stdout) if s.get("kind") == "SpanKind.CLIENT"]
    if disabled:
        assert spans == [] and "traceparent" not in http_received[0] and "traceparent" not in grpc_received[0]
        return
    by_protocol = {s["attributes"]["infersight.triton.protocol"]: s for s in spans}
    for protocol, received in (("http", http_received), ("grpc", grpc_received)):
        ctx = by_protocol[protocol]["context"]
        trace_id, span_id = ctx["trace_id"][2:], ctx["span_id"][2:]
        version_ids, flags = received[0]["traceparent"].rsplit("-", 1)
        assert version_ids == f"00-{trace_id}-{span_id}"
        assert int(flags, 16) & 1  # sampled (the SDK may also set W3C level 2's random-trace-id bit)
        assert by_protocol[protocol]["attributes"]["gen_ai.request.model"] == "echo"
        assert by_protocol[protocol]["resource"]["attributes"]["service.name"] == "triton-client-test"

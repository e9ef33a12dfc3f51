"""The base install in a serving image: the wheel built from this tree, installed into fresh virtual
environments (issue #21), each then running the instrumentation's generic tests against the installed wheel
(not this source tree), a zero-code ``opentelemetry-instrument`` start that exports to an OTLP receiver, and
the base install's command line:

- oldest: the oldest supported OpenTelemetry (``oldest-constraints.txt``, pyproject's lower bounds);
- newest: whatever the newest releases within pyproject's ranges are today;
- image: a virtual environment prepared like a vLLM image (an older SDK with the FastAPI/ASGI
  instrumentations of the matching release), into which pip, as a user's image would run it, installs the
  wheel with the README's command; pip's install report must show that no installed package is replaced,
  and ``pip check`` that none is broken.

Only the base dependencies go into these environments (no torch, no vLLM): a few hundred MB from PyPI, cached
by uv and pip. Run alone: ``bin/infersight test tests/compat``; leave out: ``-m "not compat"``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from infersight.schemas.attributes import SCOPE_NAME
from tests.support.otlp_sink import OtlpSink

pytestmark = pytest.mark.compat

REPO = Path(__file__).resolve().parents[2]
OLDEST = Path(__file__).resolve().parent / "oldest-constraints.txt"
# The instrumentation's tests that need only OpenTelemetry (no engine, no stack, no source tree), run from a
# copy against the installed wheel. Helpers they import travel with them.
GENERIC_TESTS = ("test_instrumentation_bad_input", "test_instrumentation_fallbacks", "test_instrumentation_metrics",
                 "test_instrumentation_spans", "test_instrumentation_summary", "test_otlp_encoder",
                 "test_triton_python_backend", "test_cli_install", "test_instrumentation_cardinality")
HELPERS = ("tests/__init__.py", "tests/unit/__init__.py", "tests/unit/fakes.py", "tests/support/__init__.py",
           "tests/support/otlp_sink.py")
# reads this repository's source files, which the copy does not have
NEEDS_SOURCE = ("tests/unit/test_instrumentation_summary.py::"
                "test_no_instrumentation_module_reads_another_modules_private_fields")
# the image: what a vLLM OpenAI server image commonly carries (issue #21), FastAPI at the version our vLLM uses
IMAGE = ("opentelemetry-sdk==1.38.0", "opentelemetry-instrumentation-fastapi==0.59b0", "fastapi==0.136.3")
TIMEOUT_S = 600


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _uv() -> str | None:
    """uv, as bin/infersight installs it (or UV / PATH); None: pip does every install (slower)."""
    cache = Path(os.environ.get("INFERSIGHT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                             Path.home() / ".cache") / "infersight")
    for candidate in (os.environ.get("UV"), str(cache / "tools" / "bin" / "uv"), shutil.which("uv")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=kwargs.pop("timeout", TIMEOUT_S), **kwargs)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout[-4000:]}" \
                                f"\n{out.stderr[-4000:]}"
    return out


class Venv:
    """A fresh virtual environment with pip in it; installs go through uv where there is one (speed), except
    ``pip_install``, which is pip's own (what a user's image runs)."""

    def __init__(self, path: Path) -> None:
        self.path, self.uv = path, _uv()
        self.python = path / "bin" / "python"
        if self.uv:  # (bin/infersight exports its UV_CACHE_DIR: the same cache as the project's environment)
            run([self.uv, "venv", "-q", "--seed", "-p", sys._base_executable, str(path)])
        else:
            run([sys._base_executable, "-m", "venv", str(path)])

    def install(self, *args: str) -> None:
        if self.uv:
            run([self.uv, "pip", "install", "-q", "-p", str(self.python), *args])
        else:
            self.pip_install(*args)

    def pip_install(self, *args: str) -> subprocess.CompletedProcess:
        return run([str(self.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])

    def packages(self) -> dict[str, str]:
        out = run([str(self.python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
        return {canonical(p["name"]): p["version"] for p in json.loads(out.stdout)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)])
    (path,) = out.glob("infersight-*.whl")
    return path


@pytest.fixture(scope="module")
def test_copy(tmp_path_factory) -> Path:
    """The generic tests and their helpers, outside this tree, with a conftest that fails unless
    ``infersight`` comes from the environment's site-packages (the installed wheel)."""
    root = tmp_path_factory.mktemp("generic-tests")
    for rel in (*HELPERS, *(f"tests/unit/{name}.py" for name in GENERIC_TESTS)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -ra -p no:cacheprovider\n")
    (root / "conftest.py").write_text(
        "import sysconfig\nfrom pathlib import Path\n\nimport infersight.instrumentation\n\n"
        "SITE = Path(sysconfig.get_paths()['purelib']).resolve()\n"
        "assert Path(infersight.instrumentation.__file__).resolve().is_relative_to(SITE), (\n"
        "    f'infersight imported from {infersight.instrumentation.__file__}, not the installed wheel in {SITE}')\n")
    return root


def otel_versions(venv: Venv) -> dict[str, str]:
    return {name: version for name, version in venv.packages().items() if name.startswith("opentelemetry")}


def check_generic_tests(venv: Venv, test_copy: Path) -> str:
    """The generic tests in ``venv`` against its installed wheel; returns pytest's summary line."""
    venv.install(f"pytest=={pytest.__version__}")
    site = run([str(venv.python), "-c", "import infersight.instrumentation as m; print(m.__file__)"],
               cwd=test_copy).stdout.strip()
    assert Path(site).is_relative_to(venv.path), site  # the wheel, not this tree
    out = run([str(venv.python), "-m", "pytest", "-q", "--deselect", NEEDS_SOURCE, "tests/unit"], cwd=test_copy)
    summary = out.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, out.stdout[-3000:]
    return summary


SERVE = """
import json
from opentelemetry import metrics, trace
from infersight.instrumentation import Instrumentation

inst = Instrumentation(engine="custom")
with inst.request("compat-model") as req:
    with req.stage("queue"):
        pass
    req.first_token()
    req.token()
    req.usage(input_tokens=3, output_tokens=2)
provider = trace.get_tracer_provider()
provider.force_flush()
metrics.get_meter_provider().force_flush()
try:  # the image's own zero-code instrumentation, where it has one, still loads beside ours
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    fastapi = FastAPIInstrumentor().is_instrumented_by_opentelemetry
except ImportError:
    fastapi = None
print(json.dumps({"tracer_provider": type(provider).__module__, "path": type(inst.spans.current()).__name__,
                  "histograms": type(inst._histograms).__name__, "fastapi_instrumented": fastapi}))
"""


def check_zero_code_start(venv: Venv, tmp_path: Path, fastapi: bool | None = None) -> dict:
    """``opentelemetry-instrument python serve.py`` configured by OTEL_* alone (the distro's defaults, our OTLP
    span exporter by its entry point): the request's spans and metrics reach an OTLP/gRPC receiver."""
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    sink = OtlpSink(keep=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
        env.update(OTEL_SERVICE_NAME="infersight-compat", OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
                   OTEL_TRACES_EXPORTER="infersight_otlp", OTEL_LOGS_EXPORTER="none",
                   OTEL_EXPORTER_OTLP_INSECURE="true", INFERSIGHT_REGION="eu-west-1")
        out = run([str(venv.path / "bin" / "opentelemetry-instrument"), str(venv.python), str(script)],
                  env=env, cwd=tmp_path, timeout=120)
        # (opentelemetry-instrumentation 0.48 stopped the whole start on a distribution without an
        # `instruments` extra, logging "Failed to auto initialize" and a traceback)
        assert "Traceback" not in out.stderr and "ERROR" not in out.stderr and "Failed" not in out.stderr, \
            out.stderr[-3000:]
        started = json.loads(out.stdout.strip().splitlines()[-1])
        assert started == {"tracer_provider": "opentelemetry.sdk.trace", "path": "_FastPath",
                           "histograms": "HistogramBank", "fastapi_instrumented": fastapi}, started
        spans = {(scope.scope.name, span.name)
                 for request in sink.kept for rs in request.resource_spans for scope in rs.scope_spans
                 for span in scope.spans}
        assert {(SCOPE_NAME, "chat compat-model"), (SCOPE_NAME, "queue")} <= spans, spans
        assert sink.metric_exports >= 1
        return started
    finally:
        sink.stop()


TRITON_MODEL = """
import json

from infersight.instrumentation.triton import traced_execute


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = json.loads(args["model_config"])["name"]

    @traced_execute()
    def execute(self, requests):
        return [None for _ in requests]
"""
# stands in for Triton's Python-backend stub: a process tritonserver starts, whose embedded interpreter
# loads model.py and calls execute() (flushing at exit, as the SDK does when the stub stops)
TRITON_STUB = """
import importlib.util, json, sys

spec = importlib.util.spec_from_file_location("model", sys.argv[1])
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)


class Request:
    def trace(self):
        raise AttributeError("Triton started without OpenTelemetry trace mode")

    def parameters(self):
        return json.dumps({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})

    def request_id(self):
        return "r1"


m = model.TritonPythonModel()
m.initialize({"model_config": json.dumps({"name": "llm"})})
m.execute([Request()])
"""


def check_triton_start(venv: Venv, tmp_path: Path) -> None:
    """The README's Triton line, ``opentelemetry-instrument tritonserver ...``, with a shell standing in for
    tritonserver (not a Python program) and a Python process for its Python-backend stub: the stub inherits
    opentelemetry-instrument's environment, configures the SDK from OTEL_* and exports the decorated
    execute()'s span in the request's trace. (Not run on a real Triton server: none runs here.)"""
    model = tmp_path / "models" / "llm" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text(TRITON_MODEL)
    (tmp_path / "stub.py").write_text(TRITON_STUB)
    sink = OtlpSink(keep=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
        env.update(OTEL_SERVICE_NAME="triton-llm", OTEL_EXPORTER_OTLP_ENDPOINT=sink.endpoint,
                   PATH=f"{venv.path / 'bin'}{os.pathsep}{env.get('PATH', '')}")
        out = run(["opentelemetry-instrument", "sh", "-c", f"python stub.py {model}"], env=env, cwd=tmp_path,
                  timeout=120)
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        spans = {(scope.scope.name, span.name, span.trace_id.hex())
                 for request in sink.kept for rs in request.resource_spans for scope in rs.scope_spans
                 for span in scope.spans}
        assert spans == {(f"{SCOPE_NAME}.triton.python_backend", "execute llm", "4bf92f3577b34da6a3ce929d0e0e4736")}
    finally:
        sink.stop()


def check_command_line(venv: Venv, tmp_path: Path) -> None:
    """The base install's `infersight`: a stack command ends with one error line and one fix line."""
    for command in ("up", "down"):
        out = subprocess.run([str(venv.path / "bin" / "infersight"), command], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 2, out.stderr
        assert lines[0].startswith(f"error: `infersight {command}` ") and "pipeline extra" in lines[0]
        assert lines[1] == "  fix: pip install 'infersight[pipeline]'"


def test_oldest_supported_opentelemetry(wheel, test_copy, tmp_path):
    venv = Venv(tmp_path / "venv")
    venv.install("-c", str(OLDEST), str(wheel))
    pinned = {canonical(line.split("==")[0]): line.split("==")[1].strip()
              for line in OLDEST.read_text().splitlines() if "==" in line and not line.startswith("#")}
    installed = venv.packages()
    assert {name: installed.get(name) for name in pinned} == pinned
    print("oldest, generic tests:", check_generic_tests(venv, test_copy))
    check_zero_code_start(venv, tmp_path)
    check_triton_start(venv, tmp_path)
    check_command_line(venv, tmp_path)


def test_newest_opentelemetry(wheel, test_copy, tmp_path):
    venv = Venv(tmp_path / "venv")
    venv.install("--upgrade", str(wheel))
    versions = otel_versions(venv)
    # at least the versions the stack pins (requirements.lock): newer ones when they are out
    locked = dict(line.split("==", 1) for line in (REPO / "requirements.lock").read_text().splitlines()
                  if line.startswith("opentelemetry-sdk=="))
    sdk = tuple(int(x) for x in versions["opentelemetry-sdk"].split(".")[:3])
    assert sdk >= tuple(int(x) for x in locked["opentelemetry-sdk"].split(".")[:3]), versions
    print("newest, generic tests:", check_generic_tests(venv, test_copy))
    check_zero_code_start(venv, tmp_path)
    check_triton_start(venv, tmp_path)
    check_command_line(venv, tmp_path)
    print("newest:", versions)


def test_installing_into_a_serving_image_replaces_and_breaks_nothing(wheel, test_copy, tmp_path):
    venv = Venv(tmp_path / "venv")
    venv.install(*IMAGE)
    run([str(venv.python), "-m", "pip", "check"])  # the image as prepared is consistent
    before = venv.packages()
    # the README's commands (section "Add it to your serving image"), as pip runs them in an image
    constraints = tmp_path / "image-packages.txt"
    frozen = run([str(venv.python), "-m", "pip", "list", "--format=freeze", "--exclude-editable",
                  "--disable-pip-version-check"])
    constraints.write_text(frozen.stdout)
    report = tmp_path / "report.json"
    venv.pip_install("--report", str(report), "--constraint", str(constraints), str(wheel))
    installed = [(canonical(item["metadata"]["name"]), item["metadata"]["version"])
                 for item in json.loads(report.read_text())["install"]]
    assert ("infersight", "0.1.0") in installed
    replaced = [f"{name} {before[name]} -> {version}" for name, version in installed if name in before]
    assert not replaced, f"pip replaced packages of the image: {replaced}"
    after = venv.packages()
    assert {name: after.get(name) for name in before} == before
    run([str(venv.python), "-m", "pip", "check"])  # nothing reported broken
    # what it added fits the image's OpenTelemetry release
    assert after["opentelemetry-exporter-otlp-proto-grpc"] == after["opentelemetry-sdk"] == "1.38.0"
    assert after["opentelemetry-distro"] == after["opentelemetry-instrumentation"] == "0.59b0"
    print("image, added:", sorted(f"{name} {version}" for name, version in installed))
    print("image, generic tests:", check_generic_tests(venv, test_copy))
    check_zero_code_start(venv, tmp_path, fastapi=True)  # the image's FastAPI instrumentation still works
    check_command_line(venv, tmp_path)
    # vLLM finds the stat-logger plugin by its entry point (loading it needs vLLM, which is not here)
    plugins = run([str(venv.python), "-c", "from importlib.metadata import entry_points; "
                   "print([e.value for e in entry_points(group='vllm.stat_logger_plugins')])"]).stdout
    assert "infersight.instrumentation.vllm_adapter.plugin:InfersightStatLogger" in plugins


def test_the_base_requirements_name_the_ranges_the_readme_names():
    """pyproject's lower bounds are the oldest versions tested here, and the README names both ends."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    bounds = {canonical(re.match(r"[A-Za-z0-9._-]+", r).group(0)): r for r in project["dependencies"]}
    pinned = {canonical(line.split("==")[0]): line.split("==")[1].strip()
              for line in OLDEST.read_text().splitlines() if "==" in line and not line.startswith("#")}
    for name, requirement in bounds.items():
        if name.startswith("opentelemetry"):
            assert "==" not in requirement and f">={pinned[name].removesuffix('.0')}" in requirement, requirement
    readme = (REPO / "README.md").read_text()
    assert "serving image" in readme and pinned["opentelemetry-sdk"] in readme
    assert sysconfig.get_python_version() in readme  # the Python version these environments ran

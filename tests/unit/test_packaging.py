"""The wheel: one distribution whose components install as infersight.<component>."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The components as pyproject.toml maps them (infersight.<component> -> its top-level folder): one list.
COMPONENTS = tuple(name.split(".", 1)[1] for name in tomllib.loads((REPO / "pyproject.toml").read_text())
                   ["tool"]["setuptools"]["package-dir"] if name != "infersight")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
                   check=True, capture_output=True, text=True)
    (path,) = out.glob("infersight-*.whl")
    return path


def test_wheel_has_only_the_infersight_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"infersight"}
    for component in COMPONENTS:
        assert f"infersight/{component}/__init__.py" in names
        # Every subpackage in the source tree ships too (the package list is explicit).
        for init in (REPO / component).rglob("__init__.py"):
            assert f"infersight/{component}/{init.relative_to(REPO / component)}" in names, init
    # Config files travel with the code that starts them.
    for data in ("infersight/collectors/gateway.yaml", "infersight/collectors/sink.yaml",
                 "infersight/collectors/builder-config.yaml", "infersight/stack/pom.xml",
                 "infersight/stack/config/kafka/server.properties",
                 "infersight/stack/config/prometheus/prometheus.yml",
                 "infersight/stack/config/flink/config.yaml",
                 "infersight/flink_jobs/common/java/io/infersight/flink/QuietWatermarks.java"):
        assert data in names


def test_base_install_is_light(wheel):
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    base = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    # OpenTelemetry and NVML's pure-Python bindings only; OpenTelemetry as ranges, never pinned (a library
    # installed into someone else's serving image must accept the versions it finds there)
    assert base and all(r.startswith(("opentelemetry-", "nvidia-ml-py")) for r in base), base
    assert not [r for r in base if r.startswith("opentelemetry-") and "==" in r], base
    assert any(r.startswith("nvidia-ml-py") for r in base), base
    extras = set(meta.get_all("Provides-Extra"))
    assert {"pipeline", "dev"} <= extras


def test_every_component_imports_from_the_wheel(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path)
    # -S: skip site (and the editable install's import hook); only the unpacked wheel and the
    # environment's third-party packages are importable.
    code = "\n".join([
        "import sys",
        f"sys.path[:0] = [{str(tmp_path)!r}, {sysconfig.get_paths()['purelib']!r}]",
        "import importlib",
        f"for c in {COMPONENTS!r}:",
        "    m = importlib.import_module('infersight.' + c)",
        f"    assert m.__file__.startswith({str(tmp_path)!r}), m.__file__",
        "from infersight.stack import paths",
        "assert paths.collector_config('gateway.yaml').is_file()",
        "print('ok')",
    ])
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

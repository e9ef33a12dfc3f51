"""Imports run one way (docs/architecture.md, "Layers"): schemas at the ground; instrumentation, collectors,
flink_jobs, dashboards and simulator on schemas only; the stack above them; the CLI and the demo on top.
Read from every module's import statements (also those inside functions), so a lazy import cannot hide."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GROUND = "schemas"
PEERS = ("instrumentation", "collectors", "flink_jobs", "dashboards", "simulator")
STACK = "stack"
TOP = "infersight"  # the CLI and the demo orchestration (folder infersight/)
# component -> the components it may import (itself always)
ALLOWED: dict[str, set[str]] = {
    GROUND: set(),
    **{peer: {GROUND} for peer in PEERS},
    STACK: {GROUND, *PEERS},
    TOP: {GROUND, *PEERS, STACK},
}
# infersight.<name> -> the component (folder) it lives in; modules of the top package are the top layer
COMPONENTS = {GROUND, *PEERS, STACK}


def _component_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "infersight" or len(parts) == 1:  # the bare package: its __init__ holds no code
        return None
    return parts[1] if len(parts) > 1 and parts[1] in COMPONENTS else TOP


def imported_components(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, component) of every infersight import in the file at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from infersight import stack` names the component in the alias
            modules = ([f"{node.module}.{a.name}" for a in node.names] if node.module == "infersight"
                       else [node.module])
        else:
            continue
        for module in modules:
            component = _component_of_module(module)
            if component is not None:
                found.append((node.lineno, module, component))
    return found


def wrong_way_imports() -> list[str]:
    bad = []
    for component, allowed in ALLOWED.items():
        for path in sorted((REPO / component).rglob("*.py")):
            for line, module, target in imported_components(path):
                if target != component and target not in allowed:
                    bad.append(f"{path.relative_to(REPO)}:{line} ({component}) imports {module} ({target})")
    return bad


def test_every_component_has_a_layer():
    """A component added to pyproject.toml's package-dir must take its place here too."""
    from tests.unit.test_packaging import COMPONENTS as PACKAGED

    assert set(PACKAGED) | {TOP} == set(ALLOWED)


def test_imports_run_one_way():
    bad = wrong_way_imports()
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


@pytest.mark.parametrize("source,component,ok", [
    ("from infersight.stack import paths\n", "flink_jobs", False),
    ("def f():\n    from infersight.instrumentation.spans import Root\n", "simulator", False),
    ("import infersight.flink_jobs.metrics\n", "schemas", False),
    ("from infersight import cli\n", "stack", False),
    ("from infersight.schemas import attributes\n", "flink_jobs", True),
    ("from infersight.flink_jobs import windows\n", "stack", True),
])
def test_the_checker_sees_each_kind_of_import(tmp_path, source, component, ok):
    path = tmp_path / "m.py"
    path.write_text(source)
    targets = {target for _line, _module, target in imported_components(path)}
    assert (targets <= ALLOWED[component] | {component}) is ok

"""The command line knows how it was installed: a clone names `bin/infersight ...`, a pip install
`infersight ...`; a stack command in a base install (no pipeline extra) ends with one `error:` line and
one `fix:` line, never a traceback. Needs no stack (also run against the installed wheel by tests/compat)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from infersight import cli, install


@pytest.fixture
def pip_installed(monkeypatch, tmp_path):
    """infersight as a pip install sees itself: a package in site-packages, no bin/infersight beside it."""
    site = tmp_path / "site-packages"
    (site / "infersight").mkdir(parents=True)
    monkeypatch.setattr(install, "PACKAGE_ROOT", site)
    monkeypatch.setattr(install, "_SCRIPT", site / "bin" / "infersight")
    return site


@pytest.fixture
def clone(monkeypatch, tmp_path):
    root = tmp_path / "infersight-clone"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "infersight").write_text("#!/bin/sh\n")
    (root / "pyproject.toml").write_text("")
    monkeypatch.setattr(install, "PACKAGE_ROOT", root.resolve())
    monkeypatch.setattr(install, "_SCRIPT", root.resolve() / "bin" / "infersight")
    return root.resolve()


def test_a_pip_install_names_infersight(pip_installed):
    assert not install.from_clone() and install.command() == "infersight"
    assert install.for_this_install("stop it with `bin/infersight down`, then `infersight up`") == \
        "stop it with `infersight down`, then `infersight up`"


def test_a_clone_names_bin_infersight_from_its_root_and_the_full_path_elsewhere(clone, monkeypatch, tmp_path):
    monkeypatch.chdir(clone)
    assert install.from_clone() and install.command() == "bin/infersight"
    assert install.for_this_install("run `infersight setup`") == "run `bin/infersight setup`"
    monkeypatch.chdir(tmp_path)
    assert install.command() == str(clone / "bin" / "infersight")


def _stack_for_endpoints() -> SimpleNamespace:
    layout = SimpleNamespace(kafka_bootstrap="127.0.0.1:9092", regions=("us-east-1",),
                             otlp_endpoint=lambda region, proto: f"http://127.0.0.1:4317/{proto}",
                             prometheus_url="http://127.0.0.1:9090", flink_rest_url="http://127.0.0.1:8081")
    return SimpleNamespace(layout=layout, state_dir=Path("/tmp/stack"))


def test_up_ends_with_the_stop_command_of_this_install(pip_installed, capsys):
    cli._print_endpoints(_stack_for_endpoints())
    assert "stop with `infersight down`" in capsys.readouterr().out.splitlines()[-1]


def test_up_from_a_clone_ends_with_bin_infersight_down(clone, monkeypatch, capsys):
    monkeypatch.chdir(clone)
    cli._print_endpoints(_stack_for_endpoints())
    assert "stop with `bin/infersight down`" in capsys.readouterr().out.splitlines()[-1]


STACK_COMMANDS = (["setup"], ["up"], ["demo"], ["simulate"], ["jobs"], ["status"], ["down"],
                  ["topics", "--bootstrap", "x:9092"], ["flink-node", "jobmanager"])


@pytest.mark.parametrize("argv", STACK_COMMANDS, ids=lambda a: a[0])
def test_a_stack_command_without_the_pipeline_extra_is_an_error_and_a_fix(pip_installed, monkeypatch, capsys, argv):
    monkeypatch.setattr(install, "missing_extra", lambda extra="pipeline": ["apache-flink", "pyyaml"])
    assert cli.main(argv) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [
        f"error: `infersight {argv[0]}` runs the local stack, which needs the pipeline extra "
        "(apache-flink, pyyaml not installed)",
        "  fix: pip install 'infersight[pipeline]'"]


def test_a_module_missing_anyway_is_an_error_and_a_fix_not_a_traceback(pip_installed, monkeypatch, capsys):
    monkeypatch.setattr(install, "missing_extra", lambda extra="pipeline": [])

    def status(_args):
        raise ModuleNotFoundError("No module named 'yaml'", name="yaml")

    monkeypatch.setattr(cli, "cmd_status", status)
    monkeypatch.setattr(cli, "NEEDS_PIPELINE", (status,))
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: `infersight status` needs the Python module 'yaml', which is not installed",
        "  fix: pip install 'infersight[pipeline]'"]


def test_stack_errors_name_the_commands_of_this_install(pip_installed, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(install, "missing_extra", lambda extra="pipeline": [])

    def jobs(_args):
        from infersight.stack.errors import StackError

        raise StackError("stack 'default' is not running", "start it with `bin/infersight up`")

    monkeypatch.setattr(cli, "cmd_jobs", jobs)
    assert cli.main(["jobs", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.splitlines()[1] == "  fix: start it with `infersight up`"


def test_the_test_suite_outside_a_clone_says_where_it_runs(pip_installed, capsys):
    assert cli.main(["test"]) == 1
    error, fix = capsys.readouterr().err.splitlines()
    assert error.startswith("error: `infersight test` runs the test suite of a clone") and "bin/infersight test" in fix


def test_the_pipeline_extra_is_read_from_the_installed_metadata(monkeypatch):
    requires = ['opentelemetry-sdk>=1.27; extra == "pipeline"', 'surely-not-installed-xyz==1.0; extra == "pipeline"',
                'also-missing-but-dev==1; extra == "dev"', "opentelemetry-api<2,>=1.27"]
    monkeypatch.setattr(install.metadata, "requires", lambda name: requires)
    assert install.missing_extra() == ["surely-not-installed-xyz"]
    assert install.missing_extra("dev") == ["also-missing-but-dev"]


def test_in_a_clone_a_missing_module_points_at_the_clone_s_environment(clone, monkeypatch, capsys):
    monkeypatch.chdir(clone)

    def status(_args):
        raise ModuleNotFoundError("No module named 'yaml'", name="yaml")

    monkeypatch.setattr(cli, "cmd_status", status)
    assert cli.main(["status"]) == 1
    error, fix = capsys.readouterr().err.splitlines()
    assert error == "error: `bin/infersight status` needs the Python module 'yaml', which is not installed"
    assert fix.startswith("  fix: `bin/infersight setup` installs every extra")

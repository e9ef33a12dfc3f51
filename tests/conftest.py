"""Shared fixtures. Integration tests use one real local stack per session, on free ports,
in a temporary state folder, stopped and wiped at the end."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The real stack: Kafka (KRaft), 3 regional gateways + sink otelcol, Prometheus, Flink."""
    from infersight.stack import setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    if os.environ.get("INFERSIGHT_TEST_BACKEND") == "docker":
        from tests.integration.compose_stack import ComposeStack

        with ComposeStack() as compose:
            yield compose
        return
    setup.ensure_all()
    s = Stack(tmp_path_factory.mktemp("stack"), PortPlan.free())
    try:
        s.up()
        yield s
    finally:
        s.down(wipe=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the stack carries the stack's state in its report (CI keeps only pytest's output)."""
    report = yield
    stack = item.funcargs.get("stack") if hasattr(item, "funcargs") else None
    if report.failed and stack is not None and hasattr(stack, "status"):
        from tests.integration.diagnostics import stack_report

        report.sections.append(("stack at failure", stack_report(stack)))
    return report

"""The live demo against the real stack: the simulator's fleet shows up in the live view with numbers
computed by the pipeline (not by the simulator), and the demo stops what it started."""

from __future__ import annotations

import argparse
import io
import threading
import time

import pytest
from rich.console import Console

from infersight import demo
from infersight.simulator import view
from infersight.simulator.fleet import DEFAULT_MODELS, DEFAULT_REGIONS
from tests.integration.pipeline_util import Jobs, wait_until

pytestmark = pytest.mark.integration


def test_demo_shows_live_numbers_from_the_pipeline(stack):
    jobs = Jobs(stack)

    def deploy(_stack) -> None:  # the test's own job group ids, cancelled at the end
        jobs.start()
        wait_until(jobs.running, 120, "the jobs to run")

    out = io.StringIO()
    args = argparse.Namespace(rate=300.0, seed=3, scenario=None, day_s=600.0, sample_ratio=None, duration=150.0,
                              vllm=False, keep=True)
    started = time.monotonic()
    thread = threading.Thread(target=demo.demo, args=(args, stack, deploy, Console(file=out, width=200)))
    thread.start()
    def fleet_rows() -> list[dict]:  # the demo fleet's own rows: earlier tests' series may still be recent
        snap = view.snapshot(stack.layout.prometheus_url)
        return [snap.rows.get((r.name, m.name), {}) for r in DEFAULT_REGIONS for m in DEFAULT_MODELS]

    try:
        def numbers() -> bool:
            return all(row.get("rps", 0) > 0 and row.get("ttft_p99", 0) > 0 for row in fleet_rows())
        wait_until(numbers, 140, "live numbers for every region and model")
        seen_after = time.monotonic() - started
        # what the pipeline counted, near what was offered, once a whole window is in (the first is partial)
        fleet_rps = lambda: sum(row.get("rps", 0.0) for row in fleet_rows())  # noqa: E731
        wait_until(lambda: 0.6 * 300 < fleet_rps() < 1.4 * 300, 60, "a whole window's rate", last_of=fleet_rps)
        regions = view.snapshot(stack.layout.prometheus_url).regions
        assert all(regions[r.name].get("freshness_s", 1e9) < 60 for r in DEFAULT_REGIONS)
        # pod gauges rolled up per region (their own path: OTLP metrics -> normalize -> pods -> metrics job)
        wait_until(lambda: all(view.snapshot(stack.layout.prometheus_url).regions[r.name].get("queue") is not None
                               for r in DEFAULT_REGIONS), 90, "queue depth for every region")
    finally:
        thread.join(200)
        jobs.stop_quietly()
    printed = out.getvalue()
    assert stack.layout.prometheus_url in printed and "llama-3.1-8b-instruct" in printed
    assert not thread.is_alive()  # --duration ended it: simulator stopped, its exports flushed
    print(f"demo: live numbers {seen_after:.0f} s after start (jobs submitted by the demo)")

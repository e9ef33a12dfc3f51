"""The pipeline's cost before Flink: the fleet simulator sends through the 3 regional gateways into Kafka,
with no job running, and each step records whether every request reached Kafka (the gateways' own
``otelcol_exporter_sent_spans`` for the request-span exporter against the simulator's ledger) and the CPU
each component used. It answers how much of the machine is left for the Flink jobs at a given rate —
the ceiling no job optimisation can lift.

    .venv/bin/python -m bench.transport                       # steps 2500, 5000, 10000 requests/s, 60 s each
    .venv/bin/python -m bench.transport --steps 10000 --step-s 120

Starts its own stack (Kafka, Prometheus and the gateways only; fresh, free ports, temporary folder) and
stops it at the end. Writes bench/results/transport.json.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.jobs_bench import CLK_TCK
from bench.results_file import save_results
from bench.throughput import cpu_sample, fleet, own_cpu_s

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "transport.json"
SENT = re.compile(r'^otelcol_exporter_sent_spans\{[^}]*exporter="kafka/requests"[^}]*\} (\S+)$', re.M)
FAILED = re.compile(r'^otelcol_exporter_send_failed_spans\{[^}]*exporter="kafka/requests"[^}]*\} (\S+)$', re.M)


def gateway_counts(layout) -> tuple[int, int]:
    """Request spans the gateways wrote to Kafka, and those they failed to write, summed over regions."""
    sent = failed = 0
    for ports in layout.ports.gateways:
        with urllib.request.urlopen(f"http://{layout.host}:{ports.telemetry}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        sent += sum(int(float(v)) for v in SENT.findall(text))
        failed += sum(int(float(v)) for v in FAILED.findall(text))
    return sent, failed


def run_step(stack, rate: float, step_s: float, pids: dict[str, int]) -> dict[str, Any]:
    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator

    sent0, failed0 = gateway_counts(stack.layout)
    sim = Simulator(fleet(uuid.uuid4().hex[:6], rate), endpoints_of(stack), seed=int(rate)).start()
    before, sim_before, t0 = cpu_sample(pids), own_cpu_s(), time.monotonic()
    behind = 0.0
    while time.monotonic() - t0 < step_s:
        time.sleep(2.0)
        behind = max(behind, sim.behind_s)
    after, sim_after, wall = cpu_sample(pids), own_cpu_s(), time.monotonic() - t0
    delivered = sim.stop(flush_s=60)
    deadline = time.monotonic() + 60  # the gateways' batches and Kafka producer queues drain
    while gateway_counts(stack.layout)[0] - sent0 < sim.ledger.total and time.monotonic() < deadline:
        time.sleep(1)
    sent, failed = gateway_counts(stack.layout)
    cpu = {name: round((after[name][0] - before[name][0]) / CLK_TCK / wall, 3) for name in pids}
    cpu["simulator"] = round((sim_after - sim_before) / wall, 3)
    return {"offered_rps": rate, "achieved_rps": round(sim.ledger.total / wall, 1), "sent": sim.ledger.total,
            "in_kafka": sent - sent0, "gateway_failures": failed - failed0, "exports_delivered": delivered,
            "max_behind_s": round(behind, 2), "wall_s": round(wall, 1), "cpu_cores": cpu,
            "cpu_cores_total": round(sum(cpu.values()), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="2500,5000,10000", help="offered requests/s per step, comma-separated")
    parser.add_argument("--step-s", type=float, default=60.0)
    args = parser.parse_args()

    from infersight.stack import setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    setup.ensure_all()
    stack = Stack(Path(tempfile.mkdtemp(prefix="infersight-transport-")), PortPlan.free(), log=lambda _: None)
    transport = ["kafka", "prometheus", *(f"gateway-{r}" for r in stack.layout.regions)]
    rows = []
    started = time.monotonic()
    try:
        stack.up(only=transport)
        pids = {n: p for n, p in stack.running_components().items() if n in transport}
        for rate in (float(s) for s in args.steps.split(",")):
            print(f"[transport] {rate:,.0f} requests/s for {args.step_s:.0f} s", flush=True)
            row = run_step(stack, rate, args.step_s, pids)
            row["held"] = (row["in_kafka"] == row["sent"] and row["max_behind_s"] <= 2.0
                           and row["exports_delivered"])
            rows.append(row)
            print(f"[transport] {json.dumps(row)}", flush=True)
    finally:
        stack.down(wipe=True)
    result = {
        "what": "simulator -> 3 regional gateways -> Kafka, no Flink job: CPU left for the jobs at each rate",
        "steps": rows, "wall_s": round(time.monotonic() - started, 1),
    }
    save_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

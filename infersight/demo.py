"""``infersight simulate`` and ``infersight demo``: the simulated fleet against the local stack's gateways, and
the live demo (stack, jobs, fleet, an optional real vLLM pod, the live view). Orchestration on top of the
simulator and the stack."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from infersight import install
from infersight.simulator.fleet import FleetSpec, Perturbation

# The demo's story: a canary regression on the busiest model after 3 minutes, a silent quality drop (fast but
# worse answers) of the same model in its busiest region after 5, a slow region after 7.
DEMO_PERTURBATIONS = (
    Perturbation("canary_regression", at_s=180, duration_s=120, magnitude=2.5, model="llama-3.1-8b-instruct"),
    Perturbation("quality_drop", at_s=300, duration_s=240, magnitude=0.1, model="llama-3.1-8b-instruct",
                 region="us-east-1"),
    Perturbation("slow", at_s=420, duration_s=120, magnitude=2.0, region="ap-southeast-1"),
)
# Drift needs a baseline and samples within the demo's minutes (production: the previous day, 1 % judged). The
# quality job the demo submits compares each series with its own first windows (3 to 4 minutes, before the drop),
# and a quarter of the requests is judged, so the drop's series holds the drift signals' minimum samples (3,000
# judged in the baseline, 600 current) at --rate 300 too; canary series are too small to alarm.
DEMO_JUDGE_RATE = 0.25
DEMO_JOB_ARGS = {"infersight-quality": ["--baseline", "reference", "--reference-s", "180"]}


def add_fleet_options(p: argparse.ArgumentParser, rate: float, day_s: float, judge_rate: float = 0.01) -> None:
    p.add_argument("--rate", type=float, default=rate, help="mean requests/s over the fleet (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scenario", help="fleet JSON (any FleetSpec field: regions, models, perturbations, ...)")
    p.add_argument("--day-s", type=float, default=day_s, help="length of the simulated day (diurnal curve)")
    p.add_argument("--sample-ratio", type=float, default=None, help="share of traces kept whole (default 0.01)")
    p.add_argument("--judge-rate", type=float, default=judge_rate,
                   help="share of requests judged beside serving: their relevance, refusal and PII results "
                        "(default %(default)s)")
    p.add_argument("--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)")


def fleet_spec(args: argparse.Namespace, perturbations: tuple[Perturbation, ...] = ()) -> FleetSpec:
    overrides = {"rate_rps": args.rate, "day_s": args.day_s, "sample_ratio": args.sample_ratio,
                 "judge_rate": getattr(args, "judge_rate", None)}
    if args.scenario:
        return FleetSpec.from_json(args.scenario, **overrides)
    return FleetSpec(**{k: v for k, v in overrides.items() if v is not None}, perturbations=perturbations)


def endpoints_of(stack) -> dict[str, str]:
    lay = stack.layout
    return {r: lay.otlp_endpoint(r, "grpc").removeprefix("http://") for r in lay.regions}


def _progress_line(p) -> str:
    behind = f", {p.behind_s:.1f} s behind schedule" if p.behind_s > 0.5 else ""
    return (f"[simulate] {p.elapsed_s:6.0f} s  sent {p.sent:>10,}  offered {p.rate_rps:,.0f}/s  "
            f"achieved {p.achieved_rps:,.0f}/s  exports queued {p.backlog}  retries {p.retries}{behind}")


def simulate(args: argparse.Namespace, stack) -> int:
    if args.endpoint:
        endpoints = dict(e.split("=", 1) for e in args.endpoint)
    else:
        if not stack.running_components():
            from infersight.stack.errors import StackError
            raise StackError(f"stack '{stack.state_dir.name}' is not running",
                             "start it with `infersight up`, or pass --endpoint REGION=HOST:PORT")
        endpoints = endpoints_of(stack)
    from infersight.simulator.run import Simulator

    spec = fleet_spec(args)
    sim = Simulator(spec, endpoints, seed=args.seed)
    print(f"[simulate] {len(sim.fleet.pods)} pods in {len(spec.regions)} regions, {len(spec.models)} models; "
          f"{spec.rate_rps:,.0f} requests/s; Ctrl-C stops", flush=True)
    thread = threading.Thread(target=sim.run, kwargs={"duration_s": args.duration, "every_s": 5.0,
                                                      "on_progress": lambda p: print(_progress_line(p), flush=True)},
                              daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        print("\n[simulate] stopping", flush=True)
    delivered = sim.stop()
    print(f"[simulate] sent {sim.ledger.total:,} requests ({sum(sim.ledger.errors.values()):,} errors); "
          f"all acknowledged: {delivered}", flush=True)
    if args.ledger:
        sim.ledger.save(args.ledger)
        print(f"[simulate] ledger in {args.ledger}")
    return 0 if delivered else 1


class WebhookInbox:
    """A loopback HTTP endpoint the demo gives the verdict service as its webhook: what a user's rollback hook
    would receive, shown in the demo's status line."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args) -> None:  # noqa: A002 (the stdlib's name)
                pass

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    inbox.received.append(json.loads(body))
                except ValueError:
                    inbox.received.append({"unreadable": body[:200].decode(errors="replace")})
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/rollback"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def summary(self) -> str:
        rollouts = [str(m.get("rollout")) for m in self.received]
        return f"webhook: canary fail received for {', '.join(rollouts)}" if rollouts else ""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def demo(args: argparse.Namespace, stack, deploy, console=None) -> int:
    """Stack (if not running), jobs (those not running), simulator, live view; Ctrl-C stops what it started."""
    from infersight.simulator import view
    from infersight.simulator.run import Simulator
    from infersight.stack.components import MLFLOW_TRACKING_ENV, VERDICT_WEBHOOK_ENV

    started_stack = not stack.running_components()
    inbox = None
    if started_stack:  # the verdict service's options come from the environment at `up`; the user's own win
        if not os.environ.get(VERDICT_WEBHOOK_ENV):
            inbox = WebhookInbox()
            os.environ[VERDICT_WEBHOOK_ENV] = inbox.url
        if not os.environ.get(MLFLOW_TRACKING_ENV) and importlib.util.find_spec("mlflow") is not None:
            os.environ[MLFLOW_TRACKING_ENV] = f"sqlite:///{stack.state_dir / 'mlflow.db'}"
            print(f"[demo] final canary verdicts go to MLflow: {os.environ[MLFLOW_TRACKING_ENV]}", flush=True)
        print(f"[demo] starting the stack in {stack.state_dir} ...", flush=True)
        stack.up()
    print("[demo] submitting the Flink jobs ...", flush=True)
    deploy(stack)
    spec = fleet_spec(args, DEMO_PERTURBATIONS)
    sim = Simulator(spec, endpoints_of(stack), seed=args.seed).start()
    pod = None
    if args.vllm:
        from infersight.vllm_pod import VllmPod

        region = stack.layout.regions[0]
        print(f"[demo] starting the tiny vLLM engine as a pod in {region} (a minute or two on CPU) ...", flush=True)
        pod = VllmPod(stack.state_dir / "vllm-pod", stack.layout.otlp_endpoint(region), region).start()
    started = time.monotonic()
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def status() -> str:
        p = sim.progress()
        line = (f"simulator: {p.sent:,} requests sent, offering {p.rate_rps:,.0f}/s, {len(sim.fleet.pods)} pods  "
                f"| {time.monotonic() - started:.0f} s  | Ctrl-C stops")
        if pod is not None:
            line += f"\nvLLM pod: {pod.served} requests served ({pod.failed} failed)"
        active = [f"{x.kind} {x.region or x.model}" for x in spec.perturbations if x.active(p.elapsed_s)]
        line += f"\nfaults now: {', '.join(active)}" if active else ""
        return line + (f"\n{inbox.summary()}" if inbox is not None and inbox.received else "")

    deadline = None if args.duration is None else started + args.duration
    try:
        view.live(stack.layout.prometheus_url, status, console=console,
                  until=lambda: stop.is_set() or (deadline is not None and time.monotonic() >= deadline))
    except KeyboardInterrupt:
        pass
    print("\n[demo] stopping ...", flush=True)
    if pod is not None:
        pod.stop()
    sim.stop(flush_s=30)
    if inbox is not None:
        inbox.close()
    if started_stack and not args.keep:
        from infersight.stack.jobs import stop_all

        stop_all(stack.layout, log=lambda m: print(m, flush=True))  # savepoints: no Kafka transaction left open
        stack.down()
        print(f"[demo] stack stopped (its data is kept; `{install.command()} down --wipe` removes it)")
    else:
        print(f"[demo] the stack keeps running (`{install.command()} down` stops it)")
    return 0

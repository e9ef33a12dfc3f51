"""``infersight`` command line: set up, start, inspect and stop the local stack; run the tests.

From a clone, ``bin/infersight`` makes the Python environment (every extra) and then runs this module.
From ``pip install infersight`` the ``infersight`` script runs it: the base install is a serving pod's
(OpenTelemetry, no stack), so the stack's commands first check for the ``pipeline`` extra and end with one
``error:`` line and a ``fix:`` line when it is missing, never a traceback. Every message names commands
as this installation runs them (``infersight down`` or ``bin/infersight down``: ``infersight.install``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from infersight import install
from infersight.stack.errors import StackError

REPO_ROOT = Path(__file__).resolve().parent.parent


def _stack(args: argparse.Namespace):
    from infersight.stack import paths, statefile
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import STATE_FILE, Stack

    state_dir = Path(args.state_dir) if args.state_dir else paths.stacks_dir() / args.stack
    topology = getattr(args, "topology", None)
    if getattr(args, "base_port", None):
        ports = PortPlan.from_base(args.base_port, topology=topology or "single")
    elif topology:  # remembered with the ports: later commands (status, down, demo, ...) follow the saved plan
        saved = statefile.read_json(state_dir / STATE_FILE).get("ports")
        plan = PortPlan.from_dict(saved) if saved else None
        ports = plan if plan and plan.topology == topology else PortPlan.default(topology=topology)
    else:
        ports = None
    return Stack(state_dir, ports)


def cmd_setup(args: argparse.Namespace) -> int:
    from infersight.stack import setup

    if getattr(args, "only", None) == "jars":  # container images need only the JVM artifacts
        setup.ensure_jars()
        return 0
    seconds = setup.ensure_all()
    print(f"[setup] ready in {seconds:.1f} s", flush=True)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    cmd_setup(args)
    stack = _stack(args)
    print(f"[up] stack '{stack.state_dir.name}' in {stack.state_dir}", flush=True)
    seconds = stack.up()
    print(f"[up] all components healthy in {seconds:.1f} s", flush=True)
    if not args.no_jobs:
        _deploy(stack)
    _print_endpoints(stack)
    return 0


def _deploy(stack, extra_args=None) -> None:
    from infersight.stack import jobs

    jobs.deploy(stack.layout, stack.state_dir / "archive", log=lambda m: print(m, flush=True), extra_args=extra_args)


def cmd_jobs(args: argparse.Namespace) -> int:
    from infersight.stack import jobs

    stack = _stack(args)
    if not stack.running_components():
        raise StackError(f"stack '{stack.state_dir.name}' is not running", "start it with `infersight up`")
    if args.stop:
        jobs.stop_all(stack.layout)
    else:
        _deploy(stack)
    return 0


def _print_endpoints(stack) -> None:
    lay = stack.layout
    multi = getattr(lay, "multi_region", False)
    print(f"  Kafka bootstrap    {lay.kafka_bootstrap}" + (" (global)" if multi else ""))
    if multi:
        from infersight.stack.multiregion import relay_url

        for region in lay.regions:
            print(f"  Kafka {region:<14}{lay.region_bootstrap(region)}; link control {relay_url(lay, region)}")
    for region in lay.regions:
        print(f"  OTLP {region:<15}{lay.otlp_endpoint(region, 'grpc')} (gRPC), "
              f"{lay.otlp_endpoint(region, 'http')} (HTTP)")
    print(f"  Prometheus         {lay.prometheus_url}")
    print(f"  Flink web UI       {lay.flink_rest_url}")
    print(f"  Parquet archive    {stack.state_dir / 'archive'}")
    print(f"  stop with `{install.command()} down`; state and logs in", stack.state_dir)


def cmd_simulate(args: argparse.Namespace) -> int:
    from infersight import demo

    return demo.simulate(args, _stack(args))


def cmd_demo(args: argparse.Namespace) -> int:
    from infersight import demo

    cmd_setup(args)
    stack = _stack(args)
    code = demo.demo(args, stack, lambda s: _deploy(s, demo.DEMO_JOB_ARGS))
    return code


def cmd_status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    rows = stack.status()
    if not any(r.running for r in rows) and not stack.supervisor_pid():
        print(f"stack '{stack.state_dir.name}' is not running ({stack.state_dir})")
        return 1
    restarted = stack.ensure_supervisor()  # a stack that runs is supervised: start a supervisor that went missing
    print(f"{'component':<24}{'state':<9}{'pid':<8}{'restarts':<10}{'ports':<64}log")
    for r in rows:
        state = "healthy" if r.healthy else ("running" if r.running else "stopped")
        if r.restart_in_s is not None:
            state = "backoff"
        ports = ", ".join(f"{k}={v}" for k, v in r.ports.items()) or "-"
        print(f"{r.name:<24}{state:<9}{r.pid or '-'!s:<8}{r.restarts:<10}{ports:<64}{r.log}")
    for r in rows:
        if r.restart_in_s is not None:
            print(f"  {r.name}: {r.last_exit}; restarting in {r.restart_in_s:.0f} s (back-off)")
        elif r.restarts and r.last_exit:
            print(f"  {r.name}: restarted {r.restarts} time(s); last exit: {r.last_exit}")
    policy = stack.restart_book().policy
    how = "started now (it was not running)" if restarted else "running"
    print(f"supervisor: {how} (pid {stack.supervisor_pid()}); restarts a component that dies after "
          f"{policy.initial_s:g} s, doubling to {policy.max_s:g} s while it keeps dying; "
          f"log {stack.layout.logs / 'supervisor.log'}")
    return 0 if all(r.healthy for r in rows) else 2


def cmd_down(args: argparse.Namespace) -> int:
    stack = _stack(args)
    stopped = stack.down(wipe=args.wipe)
    if not stopped:
        print(f"stack '{stack.state_dir.name}' is not running; nothing to stop")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from infersight.stack.kafka_admin import ensure_topics, wait_ready

    wait_ready(args.bootstrap, timeout_s=args.wait)
    created = ensure_topics(args.bootstrap)
    print(f"topics created: {', '.join(created) or 'none (all exist)'}")
    return 0


def cmd_flink_node(args: argparse.Namespace) -> int:
    """Run a Flink job or task manager in the foreground (the container image's entry point)."""
    from infersight.stack import flink_config, paths

    conf = flink_config.write_conf(Path(args.conf_dir),
                                   flink_config.container_overrides(args.rpc_address, Path(args.data_dir)))
    os.environ["FLINK_CONF_DIR"] = str(conf)
    script = paths.pyflink_home() / "bin" / f"{args.role}.sh"
    os.execvp("bash", ["bash", str(script), "start-foreground"])
    return 1  # not reached


def cmd_test(args: argparse.Namespace) -> int:
    cmd_setup(args)
    env = {**os.environ, "INFERSIGHT_SETUP_DONE": "1"}
    cmd = [sys.executable, "-m", "pytest", *args.pytest_args]
    print("[test]", " ".join(cmd[2:]), flush=True)
    return subprocess.call(cmd, cwd=REPO_ROOT, env=env)


def cmd_detect(args: argparse.Namespace) -> int:
    """``detect replay``: window-stats CSV through the detect job's own core, incidents as JSON lines."""
    import json

    from infersight.flink_jobs.detect.replay import replay_file

    events = Path(args.events) if args.events else None
    summary = replay_file(Path(args.input), Path(args.out), events)
    print(json.dumps(summary, sort_keys=True))
    return 0


def demo_mod():
    from infersight import demo

    return demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infersight", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def stack_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--stack", default="default", help="stack name (state under the cache folder)")
        p.add_argument("--state-dir", help="explicit state folder (overrides --stack)")

    p = sub.add_parser("setup", help="fetch and build everything the stack needs (idempotent)")
    p.add_argument("--only", choices=["jars"], help="only this part (container images)")
    p.set_defaults(func=cmd_setup)
    p = sub.add_parser("up", help="set up if needed, start the local stack, wait until healthy")
    stack_opts(p)
    p.add_argument("--base-port", type=int, help="lay every port out from this base (two stacks side by side)")
    p.add_argument("--no-jobs", action="store_true", help="start the services only, not the Flink jobs")
    p.add_argument("--topology", choices=["single", "multi-region"],
                   help="single: one Kafka (the default); multi-region: a Kafka per region, mirrored by "
                        "MirrorMaker 2 through a link relay each into a global Kafka where the jobs run. "
                        "Remembered by the stack: later commands follow it")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("demo", help="the live demo: set-up, stack, jobs, a simulated 3-region fleet and a live "
                                    "view of what the pipeline computes (Ctrl-C stops what it started)")
    stack_opts(p)
    demo_mod().add_fleet_options(p, rate=1000.0, day_s=600.0, judge_rate=demo_mod().DEMO_JUDGE_RATE)
    p.add_argument("--vllm", action="store_true", help="add the real tiny vLLM engine as one more pod")
    p.add_argument("--keep", action="store_true", help="leave the stack running on exit")
    p.add_argument("--topology", choices=["single", "multi-region"],
                   help="single: one Kafka (the default); multi-region: a Kafka per region, mirrored by "
                        "MirrorMaker 2 through a link relay each into a global Kafka where the jobs run. "
                        "As `up --topology`")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("simulate", help="send a simulated fleet's telemetry to the stack's regional gateways")
    stack_opts(p)
    demo_mod().add_fleet_options(p, rate=1000.0, day_s=86_400.0)
    p.add_argument("--endpoint", action="append", default=[], metavar="REGION=HOST:PORT",
                   help="a region's OTLP gRPC endpoint (default: the local stack's gateways)")
    p.add_argument("--ledger", help="write what was sent (per series) to this JSON file")
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser("jobs", help="submit the Flink jobs (stack/jobs.py JOBS) that are not running")
    stack_opts(p)
    p.add_argument("--stop", "--cancel", dest="stop", action="store_true",
                   help="stop them instead, each with a savepoint (their Kafka transactions commit)")
    p.set_defaults(func=cmd_jobs)
    p = sub.add_parser("status", help="health, ports and log file of each component")
    stack_opts(p)
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("down", help="stop the processes this stack started (data is kept)")
    stack_opts(p)
    p.add_argument("--wipe", action="store_true", help="also delete the stack's data")
    p.set_defaults(func=cmd_down)
    p = sub.add_parser("topics", help="create the project's Kafka topics on any cluster (idempotent)")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the broker")
    p.set_defaults(func=cmd_topics)
    p = sub.add_parser("flink-node", help="run a Flink node in the foreground (docker-compose)")
    p.add_argument("role", choices=["jobmanager", "taskmanager"])
    p.add_argument("--rpc-address", default="jobmanager")
    p.add_argument("--conf-dir", default="/tmp/infersight-flink-conf")
    p.add_argument("--data-dir", default="/var/lib/infersight/flink")
    p.set_defaults(func=cmd_flink_node)
    p = sub.add_parser("detect", help="anomaly detection offline (docs/detection.md)")
    dsub = p.add_subparsers(dest="detect_command", required=True)
    d = dsub.add_parser("replay", help="replay a window-stats CSV (window_end, region, model, track, signal, value) "
                                       "through the detectors; one JSON incident per line")
    d.add_argument("--input", required=True, help="window-stats CSV")
    d.add_argument("--out", required=True, help="incidents, JSON lines")
    d.add_argument("--events", help="also write every anomaly point and incident event here (JSON lines)")
    d.set_defaults(func=cmd_detect)
    p = sub.add_parser("test", help="set up if needed and run the test suite (extra args go to pytest)")
    p.add_argument("pytest_args", nargs="*", help="passed to pytest as they are")
    p.set_defaults(func=cmd_test)
    return parser


# the commands that run or prepare the local stack: they need the pipeline extra
NEEDS_PIPELINE = (cmd_setup, cmd_up, cmd_demo, cmd_simulate, cmd_jobs, cmd_status, cmd_down, cmd_topics,
                  cmd_flink_node)


def check_installed(args: argparse.Namespace, name: str) -> None:
    """A StackError when this installation cannot run the command: a stack command without the pipeline
    extra, or the test suite outside a clone (the tests are not in the wheel)."""
    if args.func is cmd_test and not install.from_clone():
        raise StackError("`infersight test` runs the test suite of a clone of the repository; a pip install has "
                         "no tests", "clone the repository and run bin/infersight test in the clone")
    if args.func in NEEDS_PIPELINE and not install.from_clone():  # a clone's environment has every extra
        missing = install.missing_extra()
        if missing:
            named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise StackError(f"`infersight {name}` runs the local stack, which needs the pipeline extra "
                             f"({named} not installed)", install.extra_fix())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else ""
    try:
        if argv[:1] == ["test"] and argv[1:2] not in (["-h"], ["--help"]):
            # Everything after `test` belongs to pytest, options included.
            args = argparse.Namespace(func=cmd_test, pytest_args=argv[1:])
        else:
            args = build_parser().parse_args(argv)
        name = getattr(args, "command", None) or name
        check_installed(args, name)
        return int(args.func(args) or 0)
    except StackError as exc:
        print(f"error: {install.for_this_install(exc.problem)}\n  fix: {install.for_this_install(exc.fix)}",
              file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # a package of an extra this installation lacks
        fix = install.extra_fix()
        print(f"error: `{install.command()} {name}` needs the Python module '{exc.name}', which is not installed\n"
              f"  fix: {install.for_this_install(fix)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

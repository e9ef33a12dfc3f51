"""Stack figures: set-up time cold and warm, start to all-healthy, resident memory at idle.

    .venv/bin/python -m bench.stack_bench            # full: includes a cold set-up (~8 min)
    .venv/bin/python -m bench.stack_bench --quick    # < 3 min: warm set-up, start, idle RSS;
                                                     # keeps the last measured cold figure

Writes bench/results/stack.json. Cold = a fresh clone with an empty INFERSIGHT_CACHE (uv,
Maven, Go module and build caches all empty); warm = a fresh clone with the cache populated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results_file import save_results

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "stack.json"


def timed_setup(clone_parent: Path, cache: Path | None) -> float:
    clone = clone_parent / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = dict(os.environ)
    if cache is not None:
        env["INFERSIGHT_CACHE"] = str(cache)
        env.pop("UV_CACHE_DIR", None)
    t0 = time.monotonic()
    subprocess.run([str(clone / "bin" / "infersight"), "setup"], check=True, env=env)
    return time.monotonic() - t0


def tree_rss_kib(pid: int) -> int:
    """RSS of a process and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return total


def measure_stack(idle_s: float) -> tuple[float, dict[str, float]]:
    from infersight.stack import setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    setup.ensure_all()
    with tempfile.TemporaryDirectory(prefix="infersight-bench-") as tmp:
        stack = Stack(Path(tmp), PortPlan.free(), log=lambda _: None)
        try:
            start = stack.up()
            time.sleep(idle_s)
            rss = {name: tree_rss_kib(pid) / 1024 for name, pid in stack.running_components().items()}
        finally:
            stack.down(wipe=True)
    return start, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the cold set-up (reuse the last figure)")
    parser.add_argument("--idle-s", type=float, default=20.0, help="idle time before reading RSS")
    args = parser.parse_args()
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}

    with tempfile.TemporaryDirectory(prefix="infersight-warm-") as tmp:
        warm = timed_setup(Path(tmp), None)
    if args.quick:
        cold = previous.get("setup_cold_s")
        cold_note = "from the last full run" if cold is not None else "not measured (run without --quick)"
    else:
        with tempfile.TemporaryDirectory(prefix="infersight-cold-") as tmp:
            cold = timed_setup(Path(tmp), Path(tmp) / "cache")
        cold_note = "measured in this run"
    start, rss = measure_stack(args.idle_s)
    result = {
        "setup_cold_s": round(cold, 1) if cold is not None else None,
        "setup_cold_note": cold_note,
        "setup_warm_s": round(warm, 1),
        "start_to_healthy_s": round(start, 1),
        "idle_rss_mib": round(sum(rss.values()), 1),
        "idle_rss_mib_by_component": {k: round(v, 1) for k, v in sorted(rss.items())},
        "idle_s_before_rss": args.idle_s,
    }
    save_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())

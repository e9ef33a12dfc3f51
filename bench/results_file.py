"""The stamp every benchmark's results file carries (machine, time, the command that reran it) and the write."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def git_commit() -> str:
    """The commit the working tree is at, with ``-dirty`` when it holds uncommitted changes to tracked files
    (results files aside: one benchmark's fresh results must not mark the next one's run dirty)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)bench/results"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def save_results(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Add machine, commit, measured_at and command (``python -m bench.<module>`` + arguments) to ``result``;
    write it as JSON."""
    result.update({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "commit": git_commit(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(["python", "-m", f"bench.{Path(sys.argv[0]).stem}", *sys.argv[1:]]),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def merge_results(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """``save_results`` into a file other benchmarks write too (``detection.json``: scenarios and NAB): their keys
    are kept, this run's replace theirs, and the stamp is this run's."""
    merged = json.loads(path.read_text()) if path.exists() else {}
    for stamp in ("machine", "commit", "measured_at", "command"):
        merged.pop(stamp, None)
    merged.update(result)
    return save_results(path, merged)

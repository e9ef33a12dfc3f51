"""The stamp every benchmark's results file carries (machine, time, the command that reran it) and the write."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def save_results(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Add machine, measured_at and command (this script and its arguments) to ``result``; write it as JSON."""
    result.update({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result

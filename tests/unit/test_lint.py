"""The repository stays ruff-clean (docs/architecture.md, "Conventions"), checked with the pinned ruff."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:]

"""How this copy of infersight was installed, so that every message names the next step the user can run.

- From a clone (the package is the repository's own folder, ``bin/infersight`` beside it): commands are
  ``bin/infersight <command>`` (the full path when the working directory is not the clone's root), and
  ``bin/infersight`` manages the Python environment with every extra.
- From ``pip install infersight`` (a wheel in site-packages): commands are ``infersight <command>``; the
  base install is the serving pod's (OpenTelemetry only), the local stack needs the ``pipeline`` extra,
  and the test suite lives in the repository, not in the wheel.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # a clone's root, or site-packages
_SCRIPT = PACKAGE_ROOT / "bin" / "infersight"
PIPELINE_EXTRA = "pipeline"
PIPELINE_FIX = "pip install 'infersight[pipeline]'"
_COMMAND_MENTION = re.compile(r"`(?:bin/)?infersight(?= |`)")


def from_clone() -> bool:
    """True when this is a clone's source tree (an editable install or a plain checkout)."""
    return _SCRIPT.is_file() and (PACKAGE_ROOT / "pyproject.toml").is_file()


def command() -> str:
    """What the user types to run infersight: ``infersight`` (pip install) or ``bin/infersight`` (a clone;
    its full path when the working directory is elsewhere)."""
    if not from_clone():
        return "infersight"
    try:
        here = Path(os.getcwd()).resolve()
    except OSError:  # the working directory was removed
        here = None
    return "bin/infersight" if here == PACKAGE_ROOT else str(_SCRIPT)


def for_this_install(text: str) -> str:
    """``text`` with every `` `infersight ...` `` / `` `bin/infersight ...` `` command written as this
    installation runs it."""
    return _COMMAND_MENTION.sub("`" + command(), text)


def missing_extra(extra: str = PIPELINE_EXTRA) -> list[str]:
    """The distributions of ``extra`` (read from this installation's own metadata) that are not installed;
    empty when every one is, or when infersight runs from source without an install to read. (For a pip
    install: in a clone, the metadata found first may be a build's ``infersight.egg-info``.)"""
    try:
        requirements = metadata.requires("infersight") or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if not re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            continue
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if name is None:
            continue
        try:
            metadata.version(name.group(1))
        except metadata.PackageNotFoundError:
            missing.append(name.group(1))
    return missing


def extra_fix() -> str:
    """How to get the pipeline extra in this installation."""
    if from_clone():
        return (f"`{command()} setup` installs every extra into the clone's environment; if that environment was "
                "changed by hand, remove .venv and run it again")
    return PIPELINE_FIX

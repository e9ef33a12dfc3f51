"""What an evaluator sees and returns, and the plug-in entry point group for users' own evaluators."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol

PLUGIN_GROUP = "infersight.evaluators"


@dataclass(frozen=True, slots=True)
class Sample:
    """A finished request as evaluators see it (in-process; nothing here is exported by itself)."""

    model: str
    question: str
    answer: str
    finish_reason: str | None = None
    context: str | None = None  # the grounding text for faithfulness (RAG passages), when the server has it


@dataclass(frozen=True, slots=True)
class Result:
    """One evaluation: ``score`` on 0..1 (None when the judge gave nothing usable), a label, and an
    explanation that may quote content (exported only with content capture on, after the redaction hook)."""

    name: str
    score: float | None
    label: str | None = None
    explanation: str | None = None


class Evaluator(Protocol):
    """A user evaluator: a class registered under the ``infersight.evaluators`` entry point group whose
    instances (made with no arguments) have a ``name`` and ``evaluate(sample) -> results``."""

    name: str

    def evaluate(self, sample: Sample) -> Sequence[Result]: ...


def load_plugins(group: str = PLUGIN_GROUP) -> list[Evaluator]:
    """Instances of every evaluator registered under ``group``; one that fails to load raises with its name."""
    out: list[Evaluator] = []
    for ep in entry_points(group=group):
        try:
            out.append(ep.load()())
        except Exception as exc:
            raise RuntimeError(f"evaluator plug-in {ep.name!r} ({ep.value}) failed to load: {exc!r}") from exc
    return out

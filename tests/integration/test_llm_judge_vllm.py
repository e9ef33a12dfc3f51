"""The LLM judge against the real vLLM OpenAI-compatible server on the tiny random model (the fixture approach
of ``test_vllm_openai_server.py``; no stack needed). Its ratings mean nothing; the path is real: rubric prompts
over HTTP, tolerant parsing of whatever the model writes (parsed or counted as unparsed, never raised), judge
tokens counted, and a timeout that returns a failed result instead of hanging or raising."""

from __future__ import annotations

import pytest

from infersight.instrumentation.evaluation.base import Sample
from infersight.instrumentation.evaluation.llm_judge import LLMJudge
from infersight.schemas.quality import FAITHFULNESS, HARMFULNESS, RELEVANCE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from infersight.instrumentation.vllm_adapter.engine import OpenAIServer, engine_env
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model

    scratch = tmp_path_factory.mktemp("vllm-judge")
    env = engine_env(scratch, plugin=False)
    # start-up is 25-150 s here, longer on a machine shared with other test runs
    with OpenAIServer(build_tiny_model(), env=env, log_path=scratch / "server.log", startup_timeout_s=480) as srv:
        yield srv


SAMPLE = Sample("chat", "What is the capital of France?", "Paris is the capital of France.",
                context="France's capital and largest city is Paris.")


def test_rubrics_parse_or_count_and_tokens_are_counted(server):
    judge = LLMJudge(server.url + "/v1", server.model, timeout_s=60, max_retries=1, max_tokens=12)
    results = judge.evaluate(SAMPLE)
    assert [r.name for r in results] == [RELEVANCE, FAITHFULNESS, HARMFULNESS]
    for r in results:
        assert (r.score is not None and 0.0 <= r.score <= 1.0) or r.label == "unparsed", r
    u = judge.usage
    assert u.calls == 3 and u.failures == 0
    assert u.unparsed == sum(r.label == "unparsed" for r in results)
    assert u.prompt_tokens > 3 * 20 and 0 < u.completion_tokens <= 3 * 12
    # without a context there is nothing to be faithful to: that rubric is skipped
    no_ctx = judge.evaluate(Sample("chat", SAMPLE.question, SAMPLE.answer))
    assert [r.name for r in no_ctx] == [RELEVANCE, HARMFULNESS]


def test_a_timeout_is_a_failed_result_not_an_exception(server):
    # a deadline on the whole answer: 320 tokens take this server ~0.7 s (the HTTP client's timeout alone, which
    # bounds each socket wait, let such an answer through under 50 ms and even 1 ms)
    judge = LLMJudge(server.url + "/v1", server.model, timeout_s=0.05, max_retries=1, rubrics=(RELEVANCE,),
                     max_tokens=320)
    (r,) = judge.evaluate(SAMPLE)
    assert r.score is None and r.label == "judge_error" and "Timeout" in (r.explanation or "")
    assert judge.usage.failures == 1 and judge.usage.prompt_tokens == 0

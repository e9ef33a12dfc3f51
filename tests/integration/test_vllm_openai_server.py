"""The vLLM OpenAI-compatible server with the infersight plugin loaded by vLLM from the
``vllm.stat_logger_plugins`` entry point (no code in the server), exporting over OTLP (standard
``OTEL_*`` variables) to a regional gateway of the local stack. A streaming chat request carries a W3C
``traceparent``; its request span and stage spans must arrive on the ``infersight.otlp.spans`` Kafka
topic in that trace, with the gateway's region stamped. vLLM's own tracing is off here, so the trace
context comes through the plugin's capture of the request's headers.

The LLM judge runs against the same server (one start-up of vLLM, a minute or more here, for both): its ratings
from the tiny random model mean nothing; the path is real: rubric prompts over HTTP, tolerant parsing of whatever
the model writes (parsed or counted as unparsed, never raised), judge tokens counted, and a timeout that returns a
failed result instead of hanging or raising."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
import requests

from infersight.flink_jobs.normalize.otlp_spans import iter_spans
from infersight.instrumentation.evaluation.base import Sample
from infersight.instrumentation.evaluation.llm_judge import LLMJudge
from infersight.schemas import attributes as A
from infersight.schemas.quality import FAITHFULNESS, HARMFULNESS, RELEVANCE
from infersight.schemas.topics import OTLP_SPANS
from tests.integration.kafka_util import consume_until

pytestmark = pytest.mark.integration

MAX_TOKENS = 20


@pytest.fixture(scope="module")
def region(stack):
    return stack.layout.regions[2]


@pytest.fixture(scope="module")
def server(stack, region, tmp_path_factory):
    from infersight.instrumentation.vllm_adapter.engine import OpenAIServer, engine_env
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model

    scratch = tmp_path_factory.mktemp("vllm-server")
    env = engine_env(scratch, otlp_endpoint=stack.layout.otlp_endpoint(region),
                     extra={"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_RESOURCE_ATTRIBUTES": "cloud.region=moon-1"})
    env.pop("VLLM_PLUGINS", None)
    os.environ.pop("VLLM_PLUGINS", None)  # the entry point must load by itself
    # start-up is 25-150 s here, longer on a machine shared with other test runs
    with OpenAIServer(build_tiny_model(), env=env, log_path=scratch / "server.log", startup_timeout_s=480) as srv:
        yield srv


def _stream_chat(server, traceparent: str) -> dict:
    body = {"model": server.model, "messages": [{"role": "user", "content": "the quick brown fox"}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.time()
    marks, usage = [], None
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=120,
                       headers={"traceparent": traceparent}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", ()):
                if choice.get("delta", {}).get("content"):
                    marks.append(time.time())
    return {"t0": t0, "marks": marks, "usage": usage}


def test_plugin_loaded_from_entry_point_exports_stage_spans_to_region(stack, region, server):
    trace_id, client_span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    client = _stream_chat(server, f"00-{trace_id}-{client_span_id}-01")
    assert client["usage"]["completion_tokens"] == MAX_TOKENS
    assert "infersight" in server.log_tail(200_000)  # vLLM logged loading our plugin

    wanted = {f"chat {server.model}", "queue", "prefill", "decode"}
    found: dict[str, dict] = {}

    def ours(msg):
        for span in iter_spans(msg.value()):
            if span["trace_id"] == trace_id and span["name"] in wanted:
                found[span["name"]] = span
        return found if set(found) == wanted else None

    consume_until(stack.layout.kafka_bootstrap, OTLP_SPANS.name, ours, timeout_s=90)
    root = found[f"chat {server.model}"]
    assert root["parent_span_id"] == client_span_id  # joined the caller's trace
    for name in ("queue", "prefill", "decode"):
        assert found[name]["parent_span_id"] == root["span_id"], name
        assert found[name]["attributes"][A.STAGE] == name
        assert found[name]["resource"][A.CLOUD_REGION] == region  # the gateway is the authority
    assert root["resource"][A.CLOUD_REGION] == region
    assert root["attributes"][A.ENGINE] == "vllm"
    assert root["attributes"][A.GEN_AI_USAGE_OUTPUT_TOKENS] == MAX_TOKENS
    assert root["attributes"][A.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
    assert found["queue"]["end_time_unix_nano"] == found["prefill"]["start_time_unix_nano"]
    assert found["prefill"]["end_time_unix_nano"] == found["decode"]["start_time_unix_nano"]

    # server-side TTFT / ITL against what the client saw on the stream
    client_ttft = client["marks"][0] - client["t0"]
    server_ttft = root["attributes"][A.TTFT]
    assert 0 < server_ttft <= client_ttft + 0.005, (server_ttft, client_ttft)
    assert server_ttft >= client_ttft - max(0.1, 0.3 * client_ttft), (server_ttft, client_ttft)
    assert len(client["marks"]) >= 2
    client_itl = (client["marks"][-1] - client["marks"][0]) / (MAX_TOKENS - 1)
    server_itl = root["attributes"][A.ITL_MEAN]
    assert root["attributes"][A.ITL_COUNT] == MAX_TOKENS - 1
    assert abs(server_itl - client_itl) <= 0.005 + 0.3 * client_itl, (server_itl, client_itl)


# ---- the LLM judge against the same server ----

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

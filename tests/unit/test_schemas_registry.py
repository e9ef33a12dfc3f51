"""The registry: names, kinds, buckets and the input mapping of other engines' names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.registry import (
    ALL_ENTRIES,
    REGISTRY,
    VLLM_SPAN_ALIASES,
    entries,
    get,
    histogram_buckets,
    normalise_span_attributes,
)
from infersight.schemas.spec import Entry, Instrument, Kind, Source

SEMCONV_NAMES = [
    "gen_ai.request.model", "gen_ai.response.model", "gen_ai.operation.name", "gen_ai.provider.name",
    "gen_ai.system", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons",
    "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token", "gen_ai.server.request.duration",
    "gen_ai.client.token.usage", "error.type", "gen_ai.evaluation.result", "gen_ai.evaluation.name",
    "gen_ai.evaluation.score.value", "gen_ai.evaluation.score.label", "cloud.region", "k8s.pod.name",
    "k8s.namespace.name", "service.name", "service.version",
]
VLLM_NAMES = [
    "gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e", "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.time_in_model_inference", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:num_requests_waiting",
    "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
]


@pytest.mark.parametrize("name", SEMCONV_NAMES)
def test_semconv_names_are_registered_as_semconv(name):
    assert get(name).source is Source.SEMCONV


@pytest.mark.parametrize("name", VLLM_NAMES)
def test_vllm_names_are_read_and_mapped_not_emitted(name):
    entry = get(name)
    assert entry.source is Source.VLLM
    assert entry.emitted is False
    assert entry.maps_to


def test_existing_constants_keep_their_values():
    assert (A.CLOUD_REGION, A.SERVICE_NAME, A.DEPLOYMENT_TRACK) == (
        "cloud.region", "service.name", "infersight.deployment.track")


def test_our_own_names_live_under_infersight_and_never_shadow_semconv():
    ours = entries(source=Source.INFERSIGHT)
    assert ours and all(e.name.startswith("infersight.") for e in ours)
    assert not [e.name for e in entries(source=Source.SEMCONV) if e.name.startswith("infersight.")]
    with pytest.raises(ValueError, match="infersight"):
        Entry("queue.depth", Kind.METRIC, "int", Source.INFERSIGHT, "x", instrument=Instrument.GAUGE)


def test_names_are_unique_and_indexed():
    assert len(REGISTRY) == len(ALL_ENTRIES)


def test_deployment_track_values_and_model_version_engine_are_ours():
    assert A.TRACKS == ("stable", "canary", "shadow")
    for name in (A.DEPLOYMENT_TRACK, A.MODEL_VERSION, A.ENGINE, A.ITL_P99, A.QUEUE_DURATION):
        assert get(name).source is Source.INFERSIGHT


@pytest.mark.parametrize("suffix", ["count", "mean", "p50", "p90", "p99", "max"])
def test_itl_summary_attributes_exist(suffix):
    assert get(f"infersight.itl.{suffix}").kind is Kind.SPAN


def test_semconv_bucket_boundaries():
    assert histogram_buckets(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN) == (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
    assert histogram_buckets(M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN) == (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
    duration = histogram_buckets(M.GEN_AI_SERVER_REQUEST_DURATION)
    assert duration[0] == 0.01 and duration[-1] == 81.92 and len(duration) == 14
    assert all(b == pytest.approx(2 * a) for a, b in zip(duration, duration[1:], strict=False))
    assert histogram_buckets(M.GEN_AI_CLIENT_TOKEN_USAGE) == tuple(float(4**i) for i in range(14))
    assert histogram_buckets(M.GEN_AI_CLIENT_TOKEN_USAGE)[-1] == 67108864


def test_our_histograms_have_reasons_and_the_ttft_slo_is_a_bound():
    for name in (M.ITL_P99_METRIC, M.QUEUE_TIME_METRIC):
        entry = get(name)
        assert entry.buckets and len(entry.buckets_why) > 40
    assert 0.2 in histogram_buckets(M.QUEUE_TIME_METRIC)


def test_every_metric_has_an_instrument_and_histograms_have_buckets():
    for entry in entries(Kind.METRIC):
        assert entry.instrument is not None
        if entry.instrument is Instrument.HISTOGRAM and entry.emitted:
            assert entry.buckets, entry.name
    with pytest.raises(ValueError, match="not a histogram"):
        histogram_buckets(M.QUEUE_DEPTH)
    with pytest.raises(ValueError, match="strictly increasing"):
        Entry("x.y", Kind.METRIC, "double", Source.SEMCONV, "d", instrument=Instrument.HISTOGRAM, buckets=(2, 1))


def test_unknown_name_error_says_what_to_do():
    with pytest.raises(KeyError, match="add an Entry"):
        get("gen_ai.made.up")


def test_vllm_aliases_point_at_registered_names():
    for theirs, ours in VLLM_SPAN_ALIASES.items():
        assert theirs in REGISTRY and ours in REGISTRY


def test_normalise_maps_vllm_names_and_keeps_ours():
    out = normalise_span_attributes({
        A.VLLM_LATENCY_TTFT: 0.12, A.VLLM_USAGE_PROMPT_TOKENS: 40, A.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
        A.VLLM_USAGE_COMPLETION_TOKENS: 99, "other": 1})
    assert out == {A.TTFT: 0.12, A.GEN_AI_USAGE_INPUT_TOKENS: 40, A.GEN_AI_USAGE_OUTPUT_TOKENS: 7, "other": 1}


def test_instrumentation_has_no_attribute_name_literals():
    """The contract rule: names are imported from schemas, never spelled out elsewhere."""
    root = Path(__file__).resolve().parents[2] / "instrumentation"
    pattern = re.compile(r"""["'](gen_ai\.[a-z_.]+|infersight\.[a-z_.]+\.[a-z_.]+|error\.type|cloud\.region)["']""")
    allowed = {"infersight.instrumentation", "gen_ai.evaluation"}  # logger/scope name, a span name
    offenders = []
    for path in root.rglob("*.py"):
        for match in pattern.finditer(path.read_text()):
            if match.group(1) not in allowed:
                offenders.append(f"{path.name}: {match.group(1)}")
    assert not offenders

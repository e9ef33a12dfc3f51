"""The registry: every attribute, metric and event name of the contract, looked up by name.

Also the input side of the contract: other engines' spellings (vLLM's ``gen_ai.latency.*`` and
deprecated ``gen_ai.usage.prompt_tokens``/``completion_tokens``) mapped onto ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infersight.schemas import attributes as A
from infersight.schemas.attributes import ATTRIBUTES
from infersight.schemas.metrics import EVENTS, METRICS
from infersight.schemas.spec import Entry, Instrument, Kind, Source
from infersight.schemas.torch_compile import ENTRIES as TORCH_COMPILE_ENTRIES
from infersight.schemas.triton import ENTRIES as TRITON_ENTRIES

ALL_ENTRIES: tuple[Entry, ...] = ATTRIBUTES + METRICS + EVENTS + TRITON_ENTRIES + TORCH_COMPILE_ENTRIES


def _index(entries: tuple[Entry, ...]) -> dict[str, Entry]:
    index: dict[str, Entry] = {}
    for entry in entries:
        if entry.name in index:
            raise ValueError(f"telemetry name {entry.name!r} is registered twice")
        index[entry.name] = entry
    return index


REGISTRY: Mapping[str, Entry] = _index(ALL_ENTRIES)

# vLLM llm_request span attributes -> ours (values are seconds / token counts in both).
VLLM_SPAN_ALIASES: Mapping[str, str] = {
    A.VLLM_LATENCY_TTFT: A.TTFT,
    A.VLLM_LATENCY_E2E: A.E2E,
    A.VLLM_LATENCY_QUEUE: A.QUEUE_DURATION,
    A.VLLM_LATENCY_PREFILL: A.PREFILL_DURATION,
    A.VLLM_LATENCY_DECODE: A.DECODE_DURATION,
    A.VLLM_USAGE_PROMPT_TOKENS: A.GEN_AI_USAGE_INPUT_TOKENS,
    A.VLLM_USAGE_COMPLETION_TOKENS: A.GEN_AI_USAGE_OUTPUT_TOKENS,
    A.GEN_AI_SYSTEM: A.GEN_AI_PROVIDER_NAME,
}


def get(name: str) -> Entry:
    """The entry for ``name``; KeyError with a hint when the name is not part of the contract."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the telemetry registry (infersight.schemas.registry); "
                       "add an Entry in schemas/attributes.py or schemas/metrics.py first") from None


def entries(kind: Kind | None = None, source: Source | None = None, emitted: bool | None = None
            ) -> tuple[Entry, ...]:
    return tuple(e for e in ALL_ENTRIES
                 if (kind is None or e.kind is kind) and (source is None or e.source is source)
                 and (emitted is None or e.emitted is emitted))


def histogram_buckets(metric_name: str) -> tuple[float, ...]:
    entry = get(metric_name)
    if entry.instrument is not Instrument.HISTOGRAM:
        raise ValueError(f"{metric_name!r} is a {entry.instrument}, not a histogram")
    return entry.buckets


def normalise_span_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite other engines' attribute names into ours; our own spelling wins when both are present."""
    out = {k: v for k, v in attributes.items() if k not in VLLM_SPAN_ALIASES}
    for theirs, ours in VLLM_SPAN_ALIASES.items():
        if theirs in attributes and ours not in out:
            out[ours] = attributes[theirs]
    return out

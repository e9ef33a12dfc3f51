"""A tiny Llama with random weights and a BPE tokenizer trained on generated text, built offline.

Used by the tests, the benchmark and the live demo to run a real vLLM engine on a CPU-only machine in
seconds. The result is cached under a content key (the configuration and this builder's version), so
repeated calls return the existing directory at once; a half-written build is never returned (the
directory appears by an atomic rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

BUILDER_VERSION = 1
_WORDS = ("the", "model", "token", "region", "latency", "queue", "prefill", "decode", "cache", "prefix",
          "request", "stream", "server", "engine", "batch", "kernel", "tensor", "layer", "head", "block",
          "alpha", "beta", "gamma", "delta", "north", "south", "east", "west", "quick", "brown", "fox",
          "jumps", "over", "lazy", "dog", "zero", "one", "two", "three", "four", "five", "six", "seven")


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0
    corpus_lines: int = 4000

    def key(self) -> str:
        blob = json.dumps({"builder": BUILDER_VERSION, **asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def default_cache_dir() -> Path:
    """``INFERSIGHT_MODEL_CACHE``, else ``$XDG_CACHE_HOME/infersight/models`` (``~/.cache/...``)."""
    explicit = os.environ.get("INFERSIGHT_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infersight" / "models"


def corpus(spec: TinyModelSpec) -> list[str]:
    """Deterministic generated text for the tokenizer (words, numbers, punctuation)."""
    rng = random.Random(spec.seed)
    lines = []
    for _ in range(spec.corpus_lines):
        words = [rng.choice(_WORDS) if rng.random() < 0.85 else str(rng.randint(0, 9999))
                 for _ in range(rng.randint(4, 24))]
        lines.append(" ".join(words) + rng.choice((".", "!", "?", ",", ";")))
    return lines


def build_tiny_model(cache_dir: str | Path | None = None, spec: TinyModelSpec | None = None) -> Path:
    """The directory of a tiny Llama model (config, safetensors weights, tokenizer); built if absent."""
    spec = spec or TinyModelSpec()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"tiny-llama-{spec.key()}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1")):
        os.environ.setdefault(var, value)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        _write_model(staging, spec)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; its copy is identical
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_model(out: Path, spec: TinyModelSpec) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(spec), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=spec.max_position_embeddings)
    # A plain chat template so the OpenAI chat endpoint works.
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(out)

    torch.manual_seed(spec.seed)
    config = LlamaConfig(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                         intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
                         num_attention_heads=spec.num_attention_heads,
                         num_key_value_heads=spec.num_key_value_heads,
                         max_position_embeddings=spec.max_position_embeddings,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.eos_token_id, tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "infersight-tiny-model.json").write_text(json.dumps({"builder": BUILDER_VERSION, **asdict(spec)}))

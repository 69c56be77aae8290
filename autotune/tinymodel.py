"""Write a tiny random-weight Llama, with its own tokenizer, for real-engine tests without a download.

Usage::

    <engine-python> autotune/tinymodel.py OUT_DIR [--seed N] [--force]

This file is a standalone script: it runs under the *engine's* Python (which has torch,
transformers and tokenizers) and imports nothing from autotune, because the tuner's own
environment has none of those. The result is deterministic for a given seed and library
versions: the tokenizer is trained on text embedded below plus text generated from a seeded
RNG, and the weights come from a seeded initialisation. Nothing touches the network.

The model is a 2-layer Llama (hidden 128, 4 heads, 2 KV heads, head_dim 32: the CPU attention
kernels reject head_dim 16), about 1.6 MB of bfloat16 weights, with a byte-level BPE vocabulary
of about 2k tokens and a small chat template so chat endpoints work too.

``--shape wide-kv`` writes a variant with 16 layers of 8 KV heads (32 KiB of float32 KV cache
per token, 64× the default) and 32k positions, so that one 0.02 step of a host's memory fraction
is a few tens of thousands of tokens: a KV pool a peak load can run short of, as on a GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

VOCAB_SIZE = 2048
MAX_POSITIONS = 4096
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": MAX_POSITIONS,
    },
    "wide-kv": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 16,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
    },
}
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
MARKER_FILE = "tinymodel.json"  # written last: its presence means the model is complete

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# A few pages of plain English about the subject the model will serve, so that merges look like
# real sub-words and prompts written in tests tokenize to a sensible number of tokens.
CORPUS = """\
A serving engine keeps a large language model in memory and answers requests over HTTP. Each
request carries a prompt; the engine splits it into tokens, runs the model over the prompt in a
prefill step, and then produces one new token per decode step until it reaches the maximum
number of tokens or an end-of-sequence token. Many requests are batched together, because a
forward pass over a batch costs little more than a forward pass over a single sequence when the
hardware is not saturated.

The key-value cache stores the attention keys and values of every token already processed, so
that a decode step only computes the newest token. The cache is divided into fixed-size blocks.
When the blocks run out, the scheduler must pause or preempt a running request and recompute it
later. The memory fraction decides how much of the device memory the engine may claim; the rest
of that budget after weights, activations and graphs becomes the cache.

Throughput is measured in output tokens per second. Latency has several parts: the time to the
first token, the time per output token, the inter-token latency and the end-to-end latency of a
whole request. An operator usually wants high throughput while keeping the ninety-ninth
percentile of these latencies under a service level objective.

Tuning a server means choosing launch flags: the maximum number of sequences running at once,
the maximum number of tokens batched in one step, whether long prompts are split into chunks,
whether common prefixes are cached and reused, the context length, and how many batch sizes are
captured as graphs. Each choice trades memory for speed or latency for throughput, and the best
values depend on the model, the hardware and the shape of the traffic.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How
vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards
jump quickly. Numbers such as 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 64, 128, 256, 512, 1024
and 2048 appear in configuration files, along with words like true, false, none and auto.
"""

# A small lexicon for the generated sentences, so common words get their own tokens.
_LEXICON = """
the a an of to in on for with by from at as is are was were be been model token tokens request
requests batch batches memory cache block blocks engine server client latency throughput prompt
output input decode prefill graph graphs schedule scheduler queue wait running preempt prefix chunk
chunked length context window fraction budget device host time first last next step steps rate
second seconds minute hour day night tune tuning search trial trials study sample value values best
worst median mean percentile spread fast slow large small short long high low more less many few
every each some all none open close start stop ready health metric metrics counter gauge histogram
bucket label
"""
_WORDS = _LEXICON.split()


def corpus_lines(seed: int, n_sentences: int = 4000) -> list[str]:
    """The training text: the embedded pages plus seeded pseudo-sentences over a small lexicon."""
    rng = random.Random(seed)
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    for _ in range(n_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        number = str(rng.randint(0, 4096))
        words.insert(rng.randrange(len(words)), number)
        lines.append(" ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ","]))
    return lines


def build_tokenizer(seed: int) -> Any:
    """Train a byte-level BPE on the corpus and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: Any, seed: int, shape: str = "tiny") -> Any:
    """A seeded Llama of ``shape`` sized to the tokenizer, cast to bfloat16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        **SHAPES[shape],
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16)


def write_model(out_dir: Path, seed: int, shape: str = "tiny") -> None:
    """Write config, weights, tokenizer and chat template into ``out_dir``, marker file last."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the save bars are noise in setup logs
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    model = build_model(tokenizer, seed, shape)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    marker = {"seed": seed, "shape": shape, "vocab_size": len(tokenizer), **SHAPES[shape]}
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight Llama for engine tests.")
    parser.add_argument("out_dir", type=Path, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="seed for the corpus and the weights")
    parser.add_argument("--force", action="store_true", help="rewrite even if a model is already there")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="tiny (default) or wide-kv")
    args = parser.parse_args(argv)
    if (args.out_dir / MARKER_FILE).exists() and not args.force:
        print(f"tiny model already present in {args.out_dir} (use --force to rewrite)")
        return 0
    write_model(args.out_dir, args.seed, args.shape)
    print(f"wrote tiny model to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

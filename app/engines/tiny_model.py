"""Writes a tiny Llama model directory that a vLLM engine can serve without downloading anything.

The directory holds a `config.json` (hidden 128, 2 layers, 4 heads, 2 KV heads, vocab 4096) and a
byte-level BPE tokenizer trained in about a second on generated text. The engine is started with
`load_format="dummy"`, so it makes up random weights: the outputs are noise, but the scheduler,
the KV cache, prefix caching, KV events and the OpenAI server are the real ones.

Run inside the engine environment (it needs `tokenizers` and `transformers`):

    .venv-engine/bin/python -m app.engines.tiny_model .venv-engine/tiny-llama
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 4096
# Long enough for the demo's scaled-down conversations; the engines size their KV space to it.
MAX_POSITIONS = 4096

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def _corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """Generated text with enough distinct words for BPE to fill the whole vocabulary."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    return [" ".join(rng.choice(words) for _ in range(24)) for _ in range(lines)]


def build(out: Path) -> Path:
    """Writes config.json and the tokenizer files under `out`; returns `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    # A tokenizer smaller than the model's vocabulary is fine (ids past it are never produced
    # by the tokenizer); one larger would index past the embedding table.
    assert len(fast) <= VOCAB_SIZE, f"tokenizer has {len(fast)} tokens > vocab {VOCAB_SIZE}"
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m app.engines.tiny_model OUT_DIR", file=sys.stderr)
        return 2
    out = build(Path(args[0]))
    print(f"tiny model written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

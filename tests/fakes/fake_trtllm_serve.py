"""FAKE trtllm-serve (tensorrt_llm/commands/serve.py): a click command with the real option
names and choices (from resources/flags/trtllm-1.2.json), so an unknown option fails like click
does ("Error: No such option: --usage_mode", exit 2).

It checks what the real server checks on the fake hardware (fake_trt_tools.py): the keys of the
--extra_llm_api_options YAML (its --config alias is not in the 1.2 list, so click refuses it);
for --backend tensorrt, that the engine folder holds config.json and one rank<N>.engine per rank,
was built by this TensorRT-LLM/TensorRT version (else TensorRT's
"engine plan file is not compatible" line) and for this GPU ("generated on an incompatible
device"); for TP > 1, enough visible GPUs and, without P2P, NCCL all-reduce (else CUDA's "peer
access is not supported between these two devices"). Then it serves the OpenAI API with the fake
engine of openai_engine.py (any `model` is accepted, as TensorRT-LLM does; /v1/models lists the
MODEL argument), Prometheus metrics at /prometheus/metrics, and GET /fake/launch reports the
argv, the GPU-related environment and the parsed YAML for tests.

Knobs: FAKE_TRT_ARGS (fake_trt_tools.knobs) and FAKE_TRTLLM_SERVE_ARGS (openai_engine options,
e.g. --startup-delay 2).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import click
from aiohttp import web

from tests.fakes import fake_trt_tools as t
from tests.fakes import openai_engine

PYTORCH_KEYS = {
    "kv_cache_config",
    "allreduce_strategy",
    "enable_iter_perf_stats",
    "return_perf_metrics",
    "dtype",
    "cuda_graph_config",
    "disable_overlap_scheduler",
}
TENSORRT_KEYS = {"kv_cache_config", "enable_iter_perf_stats"}
ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NCCL_P2P_DISABLE",
    "TRTLLM_NO_USAGE_STATS",
)


def die(line: str) -> None:
    t.say(line)
    sys.exit(1)


def load_config(path: str | None, backend: str) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())  # the files traylm writes are JSON (= YAML)
    except (OSError, ValueError) as exc:
        die(f"yaml.scanner.ScannerError: cannot read {path}: {exc}")
    allowed = PYTORCH_KEYS if backend == "pytorch" else TENSORRT_KEYS
    for key in data:
        if key not in allowed:
            args_class = "TorchLlmArgs" if backend == "pytorch" else "TrtLlmArgs"
            t.say(
                f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {args_class}"
            )
            t.say(key)
            die("  Extra inputs are not permitted [type=extra_forbidden]")
    return dict(data)


def check_engine(engine: Path, tp: int) -> None:
    config = t.read_json(engine / "config.json")
    built = str(config.get("version"))
    if built != t.version():
        t.say(
            f"[TensorRT-LLM][ERROR] 6: The engine plan file is not compatible with this version "
            f"of TensorRT, expecting library version {t.tensorrt_version()} got "
            f"{t.tensorrt_version(built)}, please rebuild."
        )
        die(
            "[TensorRT-LLM][ERROR] 2: [engine.cpp::deserializeEngine::1148] Error Code 2: "
            "Internal Error (Assertion engine->deserialize(start, size, allocator, runtime) "
            "failed. )"
        )
    fake_build = dict(config.get("fake_build", {}))  # type: ignore[call-overload]
    here = ".".join(map(str, t.gpu_cc()))
    if fake_build.get("compute_capability") != here:
        die(
            f"[TensorRT-LLM][ERROR] 6: The engine plan file is generated on an incompatible "
            f"device, expecting compute {here} got compute {fake_build.get('compute_capability')}"
            ", please rebuild."
        )
    pretrained = dict(config.get("pretrained_config", {}))  # type: ignore[call-overload]
    mapping = dict(pretrained.get("mapping", {}))
    world = int(mapping.get("world_size", 1))
    if int(mapping.get("tp_size", 1)) != tp:
        die(
            f"ValueError: tp_size {tp} does not match the engine's tp_size {mapping.get('tp_size')}"
        )
    for rank in range(world):
        if not (engine / f"rank{rank}.engine").exists():
            die(f"FileNotFoundError: {engine / f'rank{rank}.engine'}")


def check_parallel(tp: int, pp: int, config: dict[str, Any], backend: str) -> None:
    world = tp * pp
    if world > t.visible_gpus():
        die(
            f"RuntimeError: world size {world} needs {world} GPUs but "
            f"{t.visible_gpus()} are visible (CUDA_VISIBLE_DEVICES)"
        )
    if world == 1 or os.environ.get("FAKE_GPU_P2P") == "1":
        return
    custom = backend == "pytorch" and config.get("allreduce_strategy") != "NCCL"
    if custom or os.environ.get("NCCL_P2P_DISABLE") != "1":
        die(
            "[TensorRT-LLM][ERROR] CUDA runtime error in cudaDeviceEnablePeerAccess(peer, 0): "
            "peer access is not supported between these two devices"
        )


def serve(model: str, **opts: Any) -> None:
    k = t.knobs("serve")
    t.banner()
    t.start(k)
    backend = opts["backend"] or "pytorch"
    backend = "tensorrt" if backend == "trt" else backend
    tp = int(opts["tensor_parallel_size"] or 1)
    pp = int(opts["pipeline_parallel_size"] or 1)
    config = load_config(opts["extra_llm_api_options"], backend)
    if backend == "tensorrt":
        check_engine(Path(model), tp)
        if not opts["tokenizer"]:
            die("ValueError: --tokenizer is required to serve a TensorRT engine folder")
    check_parallel(tp, pp, config, backend)
    t.say(
        f"[TRT-LLM] [I] Using LLM with {'PyTorch' if backend == 'pytorch' else 'TensorRT'} backend"
    )
    t.say(f"[TRT-LLM] [I] Loading model {model} (tp_size={tp}, pp_size={pp})")
    host, port = opts["host"] or "localhost", int(opts["port"] or 8000)
    args = openai_engine.parse_args(
        [
            "--host",
            host,
            "--port",
            str(port),
            "--served-model-name",
            model,
            "--model",
            model,
            "--accept-any-model",
            *shlex.split(os.environ.get("FAKE_TRTLLM_SERVE_ARGS", "")),
        ]
    )
    time.sleep(args.startup_delay)
    launch = {
        "argv": sys.argv[1:],
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        "config": config,
        "backend": backend,
    }
    engine = openai_engine.FakeEngine(args)

    async def launch_info(request: web.Request) -> web.Response:
        return web.json_response(launch)

    app = web.Application()
    app.router.add_get("/health", engine.health)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_get("/prometheus/metrics", engine.metrics)
    app.router.add_get("/fake/launch", launch_info)
    app.router.add_get("/fake/stats", engine.stats)
    app.router.add_post("/v1/chat/completions", engine.chat)
    app.router.add_post("/v1/completions", engine.chat)
    t.say(f"INFO:     Started server process [{os.getpid()}]")
    t.say("INFO:     Application startup complete.")
    t.say(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
    web.run_app(app, host=host, port=port, print=None, access_log=None)


def command() -> click.Command:
    data = json.loads((t.FLAGS / "trtllm-1.2.json").read_text())
    by_dest: dict[str, list[str]] = {}
    for flag, spec in data["flags"].items():
        by_dest.setdefault(spec["dest"], []).append(flag)
    params: list[click.Parameter] = [click.Argument(["model"])]
    for dest, names in sorted(by_dest.items()):
        spec = data["flags"][names[0]]
        if not spec["takes_value"]:
            params.append(click.Option([*names, dest], is_flag=True, default=False))
        elif spec.get("choices"):
            params.append(click.Option([*names, dest], type=click.Choice(spec["choices"])))
        else:
            params.append(click.Option([*names, dest], type=str))
    return click.Command("trtllm-serve", params=params, callback=serve)


if __name__ == "__main__":
    command().main(prog_name="trtllm-serve")

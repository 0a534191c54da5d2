"""FAKE TensorRT-LLM and SGLang engine environments, and tiny FAKE Hugging Face model folders.

A fake env is shaped like the real install (``envs/trtllm-1.2.1/bin/{python,trtllm-serve,
trtllm-build}``, ``trtllm-examples/...``, ``traylm-env.json`` with the import check's version
line) but its commands run the fake tools in this folder with this interpreter. The wrappers set
the fake hardware the tools see (FAKE_GPU_CC, FAKE_GPU_COUNT, FAKE_GPU_P2P) and the fake
versions (FAKE_TRT_VERSION, FAKE_TENSORRT_VERSION). No flag list is put in the env, so traylm
uses the allow-lists it ships in resources/flags (the real TensorRT-LLM CLI definitions).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from engines.envs.manager import META_FILE, env_dir_name
from tests.fakes.fake_trt_tools import tensorrt_version

FAKES = Path(__file__).resolve().parent


def _wrapper(path: Path, body: str, exports: dict[str, str]) -> None:
    env = " ".join(f"{k}={v}" for k, v in exports.items())
    path.write_text(f"#!/bin/sh\nexport {env}\n{body}\n")
    path.chmod(0o755)


def _trampoline(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "import runpy, sys\n"
        f"sys.argv[0] = {path.name!r}\n"
        f"runpy.run_path({str(target)!r}, run_name='__main__')\n"
    )


def make_fake_trtllm_env(
    envs_dir: Path,
    *,
    version: str = "1.2.1",
    gpu_cc: str = "8.9",
    gpu_count: int = 2,
    p2p: bool = False,
    examples: bool = True,
) -> Path:
    target = envs_dir / env_dir_name("trtllm", version, "cuda")
    (target / "bin").mkdir(parents=True, exist_ok=True)
    trt = tensorrt_version(version)
    exports = {
        "FAKE_TRT_VERSION": version,
        "FAKE_TENSORRT_VERSION": trt,
        "FAKE_GPU_CC": gpu_cc,
        "FAKE_GPU_COUNT": str(gpu_count),
        "FAKE_GPU_P2P": "1" if p2p else "0",
    }
    py = sys.executable
    _wrapper(target / "bin" / "python", f'exec "{py}" "$@"', exports)
    for name, script in (
        ("trtllm-serve", "fake_trtllm_serve.py"),
        ("trtllm-build", "fake_trtllm_build.py"),
    ):
        _wrapper(target / "bin" / name, f'exec "{py}" "{FAKES / script}" "$@"', exports)
    if examples:
        ex = target / "trtllm-examples"
        _trampoline(ex / "quantization" / "quantize.py", FAKES / "fake_quantize.py")
        _trampoline(
            ex / "models" / "core" / "llama" / "convert_checkpoint.py",
            FAKES / "fake_convert_checkpoint.py",
        )
    facts = {"tensorrt_llm": version, "tensorrt": trt, "torch": "2.9.0", "torch_cuda": "12.8"}
    meta = {
        "engine": "trtllm",
        "version": version,
        "device": "cuda",
        "installed_at_s": time.time(),
        "packages": {"tensorrt_llm": version, "tensorrt": trt, "torch": "2.9.0"},
        "import_check": f"[TensorRT-LLM] TensorRT-LLM version: {version}\n"
        f"TRAYLM {json.dumps(facts)}",
    }
    (target / META_FILE).write_text(json.dumps(meta))
    return target


def make_fake_sglang_env(envs_dir: Path, *, version: str = "0.5.23", gpu_count: int = 2) -> Path:
    target = envs_dir / env_dir_name("sglang", version, "cuda")
    (target / "bin").mkdir(parents=True, exist_ok=True)
    body = (
        'if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then shift 2; '
        f'exec "{sys.executable}" "{FAKES / "fake_sglang_server.py"}" "$@"; fi\n'
        f'exec "{sys.executable}" "$@"'
    )
    _wrapper(
        target / "bin" / "python", body, {"FAKE_GPU_COUNT": str(gpu_count), "FAKE_GPU_P2P": "0"}
    )
    facts = {"sglang": version, "torch": "2.9.0", "torch_cuda": "12.8"}
    meta = {
        "engine": "sglang",
        "version": version,
        "device": "cuda",
        "installed_at_s": time.time(),
        "packages": {"sglang": version, "torch": "2.9.0"},
        "import_check": f"TRAYLM {json.dumps(facts)}",
    }
    (target / META_FILE).write_text(json.dumps(meta))
    return target


def make_tiny_hf_model(
    folder: Path,
    *,
    architecture: str = "LlamaForCausalLM",
    model_type: str = "llama",
    max_position_embeddings: int = 4096,
    weights_bytes: int = 2 * 2**20,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 4,
    index_total_size: int | None = None,
) -> Path:
    """A FAKE checkpoint folder: a real config.json and weight files of the given size (zeros;
    the fake tools only read sizes). ``index_total_size`` writes a safetensors index claiming a
    bigger model (for the fit checks)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_position_embeddings,
        "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "model.safetensors").write_bytes(b"\0" * weights_bytes)
    (folder / "tokenizer.json").write_text("{}")
    if index_total_size is not None:
        index = {"metadata": {"total_size": index_total_size}, "weight_map": {}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder

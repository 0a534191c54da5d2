"""Shared pieces of the FAKE TensorRT-LLM and SGLang tools (tests/fakes/fake_*.py).

The fakes keep the real tools' contracts: their parsers are built from the same flag lists as
traylm's allow-lists (taken from the real argparse/click definitions, see resources/flags), so an
unknown flag or value is refused with argparse's usage error and exit code 2; they read and write
the real file layouts (HF config.json, TensorRT-LLM checkpoint config.json + rank<N>.safetensors,
engine config.json + rank<N>.engine); they print the real tools' log lines; and they take time in
proportion to the model size (scaled down). Their "hardware" comes from the environment the fake
env's wrappers set: FAKE_GPU_CC ("8.9"), FAKE_GPU_COUNT, FAKE_GPU_P2P ("0"/"1"), FAKE_TRT_VERSION,
FAKE_TENSORRT_VERSION.

Per-run knobs come from FAKE_TRT_ARGS and FAKE_TRT_<TOOL>_ARGS (shlex): --seconds S (how long
the step takes), --print LINE (repeatable, printed at start), --exit CODE (exit after printing),
--oom (run out of memory half way, with TensorRT's real error lines).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FLAGS = REPO / "resources" / "flags"


def version() -> str:
    return os.environ.get("FAKE_TRT_VERSION", "1.2.1")


TENSORRT_OF = {"1.2.0": "10.13.2.6", "1.2.1": "10.13.3.9"}


def tensorrt_version(trtllm: str | None = None) -> str:
    """The TensorRT a TensorRT-LLM release pins (a fake table; each real wheel pins one)."""
    trtllm = trtllm or version()
    pinned = os.environ.get("FAKE_TENSORRT_VERSION")
    if trtllm == version() and pinned:
        return pinned
    return TENSORRT_OF.get(trtllm, f"10.{trtllm.replace('.', '')}.0.1")


def gpu_cc() -> tuple[int, int]:
    major, minor = os.environ.get("FAKE_GPU_CC", "8.9").split(".")
    return int(major), int(minor)


def visible_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = int(os.environ.get("FAKE_GPU_COUNT", "1"))
    return count if visible is None else len([v for v in visible.split(",") if v.strip()])


def parser_from_allow_list(name: str, prog: str) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the flags (and choices) of an allow-list file."""
    data = json.loads((FLAGS / name).read_text())
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    by_dest: dict[str, list[str]] = {}
    specs: dict[str, dict[str, object]] = {}
    for flag, spec in data["flags"].items():
        by_dest.setdefault(str(spec["dest"]), []).append(flag)
        specs[str(spec["dest"])] = spec
    for dest, names in by_dest.items():
        spec = specs[dest]
        if not spec["takes_value"]:
            p.add_argument(*names, dest=dest, action="store_true")
            continue
        choices = spec.get("choices")
        nargs = "+" if spec.get("multiple") else None
        p.add_argument(*names, dest=dest, choices=choices, nargs=nargs)
    return p


def knobs(tool: str) -> argparse.Namespace:
    """FAKE_TRT_ARGS (every tool) plus FAKE_TRT_<TOOL>_ARGS (QUANTIZE, CONVERT, BUILD, SERVE)."""
    p = argparse.ArgumentParser(prog="FAKE_TRT_ARGS")
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--print", dest="lines", action="append", default=[])
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--oom", action="store_true")
    p.add_argument(
        "--no-context-fmha",
        action="store_true",
        help="the model's attention cannot use fused context attention (trtllm-build)",
    )
    words = shlex.split(os.environ.get("FAKE_TRT_ARGS", ""))
    words += shlex.split(os.environ.get(f"FAKE_TRT_{tool.upper()}_ARGS", ""))
    return p.parse_args(words)


def say(line: str) -> None:
    print(line, flush=True)


def stamp() -> str:
    return time.strftime("[%m/%d/%Y-%H:%M:%S]")


def banner() -> None:
    say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")


def start(k: argparse.Namespace) -> None:
    for line in k.lines:
        say(line)
    if k.exit is not None:
        sys.exit(k.exit)


def work(seconds: float, lines: list[str], k: argparse.Namespace) -> None:
    """Spend ``seconds`` printing ``lines`` spread over the time; --oom fails half way."""
    seconds = k.seconds if k.seconds is not None else seconds
    steps = max(len(lines), 1)
    for i, line in enumerate(lines or [""]):
        if k.oom and i >= steps // 2:
            oom()
        if line:
            say(line)
        time.sleep(seconds / steps)


def oom() -> None:
    say(
        f"{stamp()} [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: "
        "OutOfMemory (no further information)"
    )
    say(f"{stamp()} [TRT-LLM] [E] Engine building failed, please check the error log.")
    say("AssertionError: Engine building failed, please check error log.")
    sys.exit(1)


def read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        say("Traceback (most recent call last):")
        say(f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'")
        sys.exit(1)
    assert isinstance(data, dict)
    return data


def weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def seconds_for(size_bytes: int, per_gib: float, base: float = 0.3) -> float:
    """Scaled-down duration: real tools take minutes per GiB; the fakes take ``per_gib`` seconds
    per GiB of weights plus a fixed start-up."""
    return base + per_gib * size_bytes / 2**30

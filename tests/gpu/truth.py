"""What an NVIDIA machine's cards really say: a read-only truth script, done in under 3 minutes.

    python tests/gpu/truth.py [--out DIR] [--seconds 12]

Needs nvidia-ml-py, and torch where present (the CUDA context cost, torch's view of memory and
the matmul load); no engine, no internet, no Hub. It is read-only: it calls no NVML function
that sets, resets or clears anything (fans, power, clocks), and never a write of traylm's
backend; tests/gpu/test_truth.py checks the source for it. It reads, in order:

1. NVML's memory v1 and v2 (total, reserved, free, used) and the clock-event reasons at idle;
2. with torch: the CUDA context's cost (NVML free before and after ``torch.cuda.mem_get_info``
   creates the context), torch's total and free, then NVML's process list against torch's own
   allocation after a 1 GiB tensor;
3. ``--seconds`` of a matmul load on every GPU (idle without torch), sampled at 5 Hz: the
   energy counter (nvmlDeviceGetTotalEnergyConsumption) against the integrated power reading,
   and the clock-event reasons under load;
4. the cost of each NVML read and of one sample of all GPUs.

It prints a table and writes into ``--out``: ``nvml-trace.jsonl``, the load as a 1 Hz trace that
``ReplayBackend`` plays (the ``gpu.replay_file`` setting, or a test), and
``card-profile.json``, the card profile that ``engines.gpu.card_profile.load`` reads for the
simulator. Exit status: 0 done, 2 no NVIDIA GPU here (said in one line, at once), 1 a failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.errors import GPUError, GPUUnavailable, TraylmError
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.gpu.backend import GPUBackend, cuda_order, decode_clock_event_reasons
from engines.gpu.card_profile import PROFILE_KIND, PROFILE_VERSION
from engines.gpu.replay import TraceRecorder

EXIT_NO_GPU = 2
MIB = 2**20
ALLOC_BYTES = 2**30
MATMUL_N = 8192
SAMPLE_INTERVAL_S = 0.2
TRACE_EVERY = 5  # samples: a 1 Hz trace
SLOW_EVERY = 25  # samples: the process list every 5 s
COST_REPEATS = 20
MAX_SECONDS = 120.0
LOAD_WARMUP_S = 2.0
TRACE_NAME = "nvml-trace.jsonl"
PROFILE_NAME = "card-profile.json"


class NoGPU(Exception):
    """No NVIDIA GPU can be read here; the message says why in one line."""


@dataclasses.dataclass(frozen=True)
class EnergyWindow:
    """One GPU over the load: the energy counter against the power reading integrated."""

    seconds: float
    counter_j: float | None
    integrated_power_j: float | None
    mean_power_w: float | None
    max_power_w: float | None
    reasons_under_load: tuple[str, ...]

    @property
    def ratio(self) -> float | None:
        if not self.counter_j or not self.integrated_power_j:
            return None
        return self.counter_j / self.integrated_power_j


# ----------------------------------------------------------------- NVML reads (read-only)


def open_nvml(lib: Any = None) -> tuple[Any, tuple[GPUInfo, ...]]:
    """traylm's NVMLBackend on ``lib`` (the pynvml module; tests pass a fake) and its GPUs."""
    try:
        from engines.gpu.nvml import NVMLBackend
    except ImportError:
        raise NoGPU(
            "no NVIDIA GPU can be read here: nvidia-ml-py is not installed "
            "(pip install 'nvidia-ml-py>=12.570')"
        ) from None
    backend = NVMLBackend(lib)
    try:
        return backend, backend.open()
    except GPUUnavailable as exc:
        why = exc.message.split(";")[0]
        raise NoGPU(f"{why}; nothing to measure: run it on a machine with an NVIDIA GPU") from None


def read(backend: Any, uuid: str, fn_name: str, *args: Any) -> Any:
    """One NVML read through the backend's one call: None where the card, the driver or this
    binding cannot give it (NotSupported, a missing function, TypeError/AttributeError)."""
    return backend.first(uuid, (fn_name, *args))


def handle(backend: Any, info: GPUInfo) -> Any:
    return read(backend, info.uuid, "nvmlDeviceGetHandleByIndex", info.index)


def memory_views(backend: Any, info: GPUInfo) -> dict[str, dict[str, int | None]]:
    """NVML's memory v1 and v2 in bytes ({} for a version this driver or binding lacks)."""
    import pynvml

    h = handle(backend, info)
    v1 = read(backend, info.uuid, "nvmlDeviceGetMemoryInfo", h)
    version = getattr(pynvml, "nvmlMemory_v2", None)
    v2 = read(backend, info.uuid, "nvmlDeviceGetMemoryInfo", h, version) if version else None
    return {
        "v1": _fields(v1, ("total", "free", "used")),
        "v2": _fields(v2, ("total", "reserved", "free", "used")),
    }


def free_bytes(backend: Any, info: GPUInfo) -> int | None:
    views = memory_views(backend, info)
    return views["v2"].get("free") or views["v1"].get("free")


def clock_reasons(backend: Any, info: GPUInfo) -> dict[str, Any]:
    """The clock-event reasons bitmask (the older binding calls them throttle reasons)."""
    h = handle(backend, info)
    mask = backend.first(
        info.uuid,
        ("nvmlDeviceGetCurrentClocksEventReasons", h),
        ("nvmlDeviceGetCurrentClocksThrottleReasons", h),
    )
    mask = mask if isinstance(mask, int) else None
    return {"mask": mask, "words": list(decode_clock_event_reasons(mask))}


def processes(backend: Any, info: GPUInfo) -> list[dict[str, int | None]]:
    found = read(backend, info.uuid, "nvmlDeviceGetComputeRunningProcesses", handle(backend, info))
    return [
        {"pid": int(p.pid), "used_bytes": _int(getattr(p, "usedGpuMemory", None))}
        for p in found or ()
    ]


def call_costs(backend: Any, infos: Sequence[GPUInfo]) -> dict[str, float]:
    """Median microseconds of each read on the first GPU, and of one sample of all GPUs."""
    info = infos[0]
    h = handle(backend, info)
    calls: dict[str, Callable[[], object]] = {
        name: (lambda name=name: read(backend, info.uuid, name, h))
        for name in (
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetComputeRunningProcesses",
        )
    }
    calls["sample (all GPUs)"] = lambda: backend.sample()
    calls["sample with processes (all GPUs)"] = lambda: backend.sample(slow=True)
    costs = {}
    for name, fn in calls.items():
        took = []
        for _ in range(COST_REPEATS):
            started = time.perf_counter()
            fn()
            took.append(time.perf_counter() - started)
        costs[name] = round(statistics.median(took) * 1e6, 1)
    return costs


# ----------------------------------------------------------------- the load, sampled


def measure(
    backend: GPUBackend,
    recorder: TraceRecorder,
    *,
    seconds: float,
    interval_s: float = SAMPLE_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, EnergyWindow]:
    """Sample every GPU for ``seconds``, write each ``TRACE_EVERY``-th sample to the trace, and
    return each GPU's energy window (by UUID). Works on any traylm GPU backend."""
    infos = backend.open()
    recorder.header(backend, infos)
    frames: list[tuple[GPUSnapshot, ...]] = []
    for n in range(max(2, round(seconds / interval_s) + 1)):
        started = time.perf_counter()
        snaps = backend.sample(slow=n % SLOW_EVERY == 0)
        if n % TRACE_EVERY == 0:
            recorder.write(snaps)
        frames.append(snaps)
        sleep(max(0.0, interval_s - (time.perf_counter() - started)))
    return {
        info.uuid: _window([s for f in frames for s in f if s.uuid == info.uuid]) for info in infos
    }


def _window(snaps: Sequence[GPUSnapshot]) -> EnergyWindow:
    powered = [(s.ts_s, s.power_draw_mw) for s in snaps if s.power_draw_mw is not None]
    integrated_mj = sum(
        (a_mw + b_mw) / 2 * (b_s - a_s) for (a_s, a_mw), (b_s, b_mw) in itertools.pairwise(powered)
    )
    counted = [s.energy_mj for s in snaps if s.energy_mj is not None]
    watts = [mw / 1000 for _, mw in powered]
    return EnergyWindow(
        seconds=round(snaps[-1].ts_s - snaps[0].ts_s, 3) if snaps else 0.0,
        counter_j=(counted[-1] - counted[0]) / 1000 if len(counted) > 1 else None,
        integrated_power_j=integrated_mj / 1000 if len(powered) > 1 else None,
        mean_power_w=round(statistics.fmean(watts), 1) if watts else None,
        max_power_w=round(max(watts), 1) if watts else None,
        reasons_under_load=tuple(sorted({r for s in snaps for r in s.clock_event_reasons})),
    )


# ----------------------------------------------------------------- torch (where present)


def import_torch() -> tuple[Any, str]:
    """torch and "" when it can use CUDA here; else None and why not."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    return torch, ""


def torch_devices(torch: Any, infos: Sequence[GPUInfo]) -> dict[str, int]:
    """NVML UUID → torch device index (by the device's UUID, else in PCI bus order)."""
    ordered = cuda_order(infos)
    found = {}
    for i in range(torch.cuda.device_count()):
        uuid = str(getattr(torch.cuda.get_device_properties(i), "uuid", ""))
        match = [info.uuid for info in infos if uuid and info.uuid.endswith(uuid)]
        if match:
            found[match[0]] = i
        elif i < len(ordered):
            found[ordered[i].uuid] = i
    return found


def torch_memory(torch: Any, backend: Any, info: GPUInfo, device: int) -> dict[str, Any]:
    """The CUDA context's cost, torch's view, and NVML's process list against torch's own
    allocation of a 1 GiB tensor."""
    before = free_bytes(backend, info)
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)  # creates this process's context here
    after = free_bytes(backend, info)
    tensor = torch.empty(ALLOC_BYTES, dtype=torch.uint8, device=f"cuda:{device}")
    torch.cuda.synchronize(device)
    own = [p["used_bytes"] for p in processes(backend, info) if p["pid"] == os.getpid()]
    result = {
        "torch": {"total": int(total), "free": int(free)},
        "cuda_context_bytes": before - after if before is not None and after is not None else None,
        "allocation": {
            "tensor_bytes": ALLOC_BYTES,
            "torch_allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "torch_reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "nvml_own_process_bytes": own[0] if own else None,
        },
    }
    del tensor
    torch.cuda.empty_cache()
    return result


@contextmanager
def matmul_load(torch: Any, devices: Sequence[int]) -> Iterator[dict[str, int]]:
    """fp16 matmuls on every device from one thread until the block ends; yields the count."""
    done = {"matmuls": 0}
    stop = threading.Event()
    mats = [
        torch.randn(MATMUL_N, MATMUL_N, dtype=torch.float16, device=f"cuda:{d}") for d in devices
    ]

    def run() -> None:
        while not stop.is_set():
            for m in mats:
                torch.matmul(m, m)
            for d in devices:
                torch.cuda.synchronize(d)
            done["matmuls"] += len(mats)

    worker = threading.Thread(target=run, name="truth-load", daemon=True)
    worker.start()
    try:
        time.sleep(LOAD_WARMUP_S)  # NVML's power reading is a 1 s average: let it settle
        yield done
    finally:
        stop.set()
        worker.join()


# ----------------------------------------------------------------- the profile and the table


def build_profile(
    infos: Sequence[GPUInfo],
    memory: dict[str, dict[str, Any]],
    idle_reasons: dict[str, dict[str, Any]],
    torch_views: dict[str, dict[str, Any]],
    windows: dict[str, EnergyWindow],
    context: dict[str, Any],
) -> dict[str, Any]:
    """The card profile (engines.gpu.card_profile reads its memory figures)."""
    gpus = []
    for info in infos:
        view = torch_views.get(info.uuid, {})
        window = windows.get(info.uuid)
        gpus.append(
            {
                "index": info.index,
                "uuid": info.uuid,
                "name": info.name,
                "pci_bus_id": info.pci_bus_id,
                "compute_capability": info.compute_capability,
                "driver_version": info.driver_version,
                "cuda_version": info.cuda_version,
                "memory": {**memory[info.uuid], "torch": view.get("torch", {})},
                "cuda_context_bytes": view.get("cuda_context_bytes"),
                "allocation": view.get("allocation", {}),
                "processes": memory[info.uuid].get("processes", []),
                "energy": {
                    **(dataclasses.asdict(window) if window else {}),
                    "counter_over_integrated": window.ratio if window else None,
                },
                "clock_event_reasons": {
                    "idle": idle_reasons[info.uuid],
                    "under_load": list(window.reasons_under_load) if window else [],
                },
            }
        )
    return {
        "kind": PROFILE_KIND,
        "version": PROFILE_VERSION,
        "measured": True,
        "recorded_at_s": time.time(),
        **context,
        "gpus": gpus,
    }


def table(profile: dict[str, Any]) -> str:
    rows: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("name", lambda g: g["name"]),
        ("NVML total v1 (MiB)", lambda g: _mib(g["memory"]["v1"].get("total"))),
        ("NVML total v2 (MiB)", lambda g: _mib(g["memory"]["v2"].get("total"))),
        ("NVML reserved (MiB)", lambda g: _mib(g["memory"]["v2"].get("reserved"))),
        ("NVML free v2 (MiB)", lambda g: _mib(g["memory"]["v2"].get("free"))),
        ("torch total (MiB)", lambda g: _mib(g["memory"]["torch"].get("total"))),
        ("CUDA context (MiB)", lambda g: _mib(g["cuda_context_bytes"])),
        ("torch reserved (MiB)", lambda g: _mib(g["allocation"].get("torch_reserved_bytes"))),
        ("NVML own process (MiB)", lambda g: _mib(g["allocation"].get("nvml_own_process_bytes"))),
        ("energy counter (J)", lambda g: _round(g["energy"].get("counter_j"))),
        ("integrated power (J)", lambda g: _round(g["energy"].get("integrated_power_j"))),
        ("counter / integrated", lambda g: _round(g["energy"].get("counter_over_integrated"), 3)),
        ("mean / max power (W)", lambda g: _pair(g["energy"])),
        ("reasons at idle", lambda g: ", ".join(g["clock_event_reasons"]["idle"]["words"])),
        ("reasons under load", lambda g: ", ".join(g["clock_event_reasons"]["under_load"])),
    ]
    gpus = profile["gpus"]
    lines = [f"{'':26}" + "".join(f"GPU {g['index']:<32}" for g in gpus)]
    for label, get in rows:
        cells = ["-" if get(g) in (None, "") else str(get(g)) for g in gpus]
        lines.append(f"{label:26}" + "".join(f"{c[:35]:36}" for c in cells))
    lines.append(f"load: {profile['load']}")
    for name, cost_us in profile["sample_cost_us"].items():
        lines.append(f"cost of {name}: {cost_us} µs")
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: written beside, then renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


# ----------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("truth-out"), help="folder for the trace and the profile"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=12.0,
        help=f"seconds of matmul load to sample (default 12, at most {MAX_SECONDS:.0f})",
    )
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be above 0 and at most {MAX_SECONDS:.0f}")
    return args


def run(args: argparse.Namespace, lib: Any = None) -> int:
    backend, infos = open_nvml(lib)
    trace = args.out / TRACE_NAME
    partial = trace.with_name(trace.name + ".tmp")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        memory = {
            i.uuid: {**memory_views(backend, i), "processes": processes(backend, i)} for i in infos
        }
        idle_reasons = {i.uuid: clock_reasons(backend, i) for i in infos}
        torch, why_not = import_torch()
        devices = torch_devices(torch, infos) if torch else {}
        views = {
            i.uuid: _torch_memory(torch, backend, i, devices[i.uuid])
            for i in infos
            if i.uuid in devices
        }
        with TraceRecorder(partial) as recorder:
            windows, load = sample_load(backend, recorder, torch, devices, args.seconds, why_not)
        partial.replace(trace)
        context = {
            "load": load,
            "seconds": args.seconds,
            "torch_version": str(getattr(torch, "__version__", "")),
            "torch_cuda": str(getattr(getattr(torch, "version", None), "cuda", "") or ""),
            "nvml_binding_version": _binding_version(),
            "sample_cost_us": call_costs(backend, infos),
        }
        profile = build_profile(infos, memory, idle_reasons, views, windows, context)
        write_json(args.out / PROFILE_NAME, profile)
    finally:
        partial.unlink(missing_ok=True)
        backend.close()
    print(table(profile))
    print(f"wrote {trace} and {args.out / PROFILE_NAME}")
    return 0


def sample_load(
    backend: Any,
    recorder: TraceRecorder,
    torch: Any,
    devices: dict[str, int],
    seconds: float,
    why_not: str,
) -> tuple[dict[str, EnergyWindow], str]:
    """The sampled window under a matmul load where torch can run one, else idle."""
    if torch is not None and devices:
        try:
            with matmul_load(torch, sorted(devices.values())) as done:
                windows = measure(backend, recorder, seconds=seconds)
            return (
                windows,
                f"fp16 {MATMUL_N}x{MATMUL_N} matmuls, {done['matmuls']} on {len(devices)} GPU(s)",
            )
        except RuntimeError as exc:  # torch's CUDA errors, out of memory included
            why_not = f"the matmul load could not start: {exc}"  # before any sample
    windows = measure(backend, recorder, seconds=seconds)
    return windows, f"idle ({why_not or 'torch sees none of these GPUs'})"


def _torch_memory(torch: Any, backend: Any, info: GPUInfo, device: int) -> dict[str, Any]:
    try:
        return torch_memory(torch, backend, info, device)
    except RuntimeError as exc:  # torch's CUDA errors, out of memory included
        return {"torch_error": str(exc)}


def main(argv: Sequence[str] | None = None, lib: Any = None) -> int:
    args = parse_args(argv)
    try:
        return run(args, lib)
    except NoGPU as exc:
        print(f"truth: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    except (GPUError, TraylmError) as exc:
        print(f"truth: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(
            f"truth: cannot write into {args.out}: {exc.strerror}; pass --out DIR", file=sys.stderr
        )
        return 1


def _fields(struct: Any, names: Sequence[str]) -> dict[str, int | None]:
    if struct is None:
        return {}
    return {name: _int(getattr(struct, name, None)) for name in names}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mib(value: Any) -> float | None:
    return None if value is None else round(value / MIB, 1)


def _round(value: Any, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _pair(energy: dict[str, Any]) -> str:
    if energy.get("mean_power_w") is None:
        return ""
    return f"{energy['mean_power_w']} / {energy['max_power_w']}"


def _binding_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return ""


if __name__ == "__main__":
    sys.exit(main())

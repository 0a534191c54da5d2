"""Real-GPU check (needs an NVIDIA driver): NVMLBackend against nvidia-smi, a trace, and cost.

    python tests/gpu/check_nvml.py [--seconds 60] [--trace gpu-trace.jsonl]

1. every NVML read of traylm is compared with ``nvidia-smi --query-gpu`` (same moment, with
   tolerances for values that move between the two reads); a field NVML cannot read must also
   be [N/A] in nvidia-smi;
2. a trace of ``--seconds`` is recorded at 1 Hz with the process list every 5 s, then replayed
   and compared sample for sample;
3. the cost of one sample of all GPUs is printed (fast path and with the slow reads).

Exit status 1 when a read disagrees or the replay differs. Takes about ``--seconds`` + 10 s.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.errors import TraylmError
from engines.events import GPUInfo, GPUSnapshot
from engines.gpu.nvml import NVMLBackend
from engines.gpu.replay import ReplayBackend, record

# nvidia-smi field → (how to read ours, tolerance: absolute, relative)
Reader = Callable[[GPUInfo, GPUSnapshot], Any]
FIELDS: dict[str, tuple[Reader, float, float]] = {
    "name": (lambda i, s: i.name, 0, 0),
    "pci.bus_id": (lambda i, s: i.pci_bus_id, 0, 0),
    "driver_version": (lambda i, s: i.driver_version, 0, 0),
    "temperature.gpu": (lambda i, s: s.temperature_c, 2, 0),
    "power.draw": (lambda i, s: _w(s.power_draw_mw), 25, 0.15),
    "enforced.power.limit": (lambda i, s: _w(s.power_limit_mw), 0.5, 0),
    "power.default_limit": (lambda i, s: _w(i.power_default_mw), 0.5, 0),
    "power.min_limit": (lambda i, s: _w(i.power_min_mw), 0.5, 0),
    "power.max_limit": (lambda i, s: _w(i.power_max_mw), 0.5, 0),
    "memory.total": (lambda i, s: _mib(s.memory_total_bytes), 1, 0),
    "memory.used": (lambda i, s: _mib(s.memory_used_bytes), 64, 0.05),
    "fan.speed": (lambda i, s: s.fans[0].speed_pct if s.fans else None, 3, 0),
    "clocks.sm": (lambda i, s: s.sm_clock_mhz, 60, 0.15),
    "clocks.mem": (lambda i, s: s.memory_clock_mhz, 60, 0.15),
    "utilization.gpu": (lambda i, s: s.utilization_gpu_pct, 35, 0),
    "pcie.link.gen.current": (lambda i, s: s.pcie_generation, 1, 0),
    "pcie.link.width.current": (lambda i, s: s.pcie_width, 0, 0),
    "pcie.link.gen.max": (lambda i, s: i.pcie_generation_max, 0, 0),
    "pcie.link.width.max": (lambda i, s: i.pcie_width_max, 0, 0),
    "persistence_mode": (
        lambda i, s: (
            None
            if s.persistence_mode is None
            else ("Enabled" if s.persistence_mode else "Disabled")
        ),
        0,
        0,
    ),
}
MOVING = {"power.draw", "clocks.sm", "clocks.mem", "utilization.gpu", "pcie.link.gen.current"}


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000


def _mib(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def query_smi(fields: list[str]) -> list[dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu=uuid,{','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    rows = csv.reader(io.StringIO(out), skipinitialspace=True)
    return [dict(zip(["uuid", *fields], (c.strip() for c in row), strict=True)) for row in rows]


def compare(field: str, ours: Any, theirs: str, abs_tol: float, rel_tol: float) -> str | None:
    """None when they agree; otherwise a line saying how they differ."""
    missing = theirs in ("[N/A]", "[Not Supported]", "N/A", "")
    if ours is None or missing:
        if ours is None and missing:
            return None
        return f"{field}: traylm {ours!r}, nvidia-smi {theirs!r} (one of them is N/A)"
    if isinstance(ours, str):
        same = ours.lower() == theirs.lower() or (
            field == "pci.bus_id" and ours.lower().endswith(theirs.lower()[-12:])
        )
        return None if same else f"{field}: traylm {ours!r}, nvidia-smi {theirs!r}"
    try:
        value = float(theirs)
    except ValueError:
        return f"{field}: nvidia-smi gave {theirs!r}, not a number"
    if abs(float(ours) - value) <= max(abs_tol, rel_tol * abs(value)):
        return None
    return f"{field}: traylm {ours}, nvidia-smi {value} (tolerance {abs_tol:g} / {rel_tol:.0%})"


def check_reads(backend: NVMLBackend) -> int:
    infos = {i.uuid: i for i in backend.open()}
    fields = list(FIELDS)
    rows = query_smi(fields)
    snaps = {s.uuid: s for s in backend.sample(slow=True)}
    problems = 0
    for row in rows:
        info, snap = infos.get(row["uuid"]), snaps.get(row["uuid"])
        if info is None or snap is None:
            print(f"GPU {row['uuid']}: seen by nvidia-smi but not by traylm")
            problems += 1
            continue
        print(f"GPU {info.index} {info.name} {info.uuid}")
        for field in fields:
            read, abs_tol, rel_tol = FIELDS[field]
            diff = compare(field, read(info, snap), row[field], abs_tol, rel_tol)
            mark = "ok  " if diff is None else ("MOVE" if field in MOVING else "DIFF")
            print(
                f"  [{mark}] {field:<26} traylm={read(info, snap)!r:<22} nvidia-smi={row[field]!r}"
            )
            if diff is not None and field not in MOVING:
                problems += 1
        print(f"  fans: {[(f.index, f.speed_pct, f.manual) for f in snap.fans]}")
        print(f"  clock events: {snap.clock_event_reasons}; processes: {snap.processes}")
        print(f"  energy {snap.energy_mj} mJ, margin {snap.temperature_margin_c} °C")
    return problems


def measure_cost(backend: NVMLBackend, n: int = 50) -> None:
    for slow in (False, True):
        costs = []
        for _ in range(n if not slow else 10):
            t = time.perf_counter()
            backend.sample(slow=slow)
            costs.append(time.perf_counter() - t)
        gpus = len(backend.infos())
        print(
            f"sample of {gpus} GPU(s), {'with' if slow else 'without'} processes+PCIe: "
            f"mean {statistics.mean(costs) * 1000:.2f} ms, "
            f"p50 {statistics.median(costs) * 1000:.2f} ms, "
            f"max {max(costs) * 1000:.2f} ms ({len(costs)} samples)"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--trace", type=Path, default=Path("gpu-trace.jsonl"))
    args = p.parse_args()
    backend = NVMLBackend()
    try:
        backend.open()
    except TraylmError as exc:
        print(f"check_nvml: {exc.message}")
        return 2
    problems = check_reads(backend)
    measure_cost(backend)
    seen: list[tuple[GPUSnapshot, ...]] = []
    costs: list[float] = []

    def keep(snaps: tuple[GPUSnapshot, ...], cost_s: float) -> None:
        seen.append(snaps)
        costs.append(cost_s)

    print(f"recording {args.seconds:.0f} s to {args.trace} ...", flush=True)
    record(backend, args.trace, seconds=args.seconds, interval_s=1.0, slow_every=5, on_sample=keep)
    print(
        f"trace: {len(seen)} samples, sampler cost per sample in the trace: mean "
        f"{statistics.mean(costs) * 1000:.2f} ms, max {max(costs) * 1000:.2f} ms"
    )
    replay = ReplayBackend(args.trace, retime=False, loop=False)
    replay.open()
    replayed = [replay.sample() for _ in seen]
    if replayed != seen:
        print("REPLAY DIFFERS from the recorded samples")
        problems += 1
    else:
        print("replay: identical to the recorded samples")
    backend.close()
    print("OK" if problems == 0 else f"{problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""``traylm gpus|fans|power|guard``: GPU telemetry and control from the command line.

    traylm gpus [--json]                  one table (reads NVML directly when no daemon runs)
    traylm gpus watch                     live, refreshing
    traylm gpus record FILE [--seconds]   a JSONL trace from NVML (or --simulate N)
    traylm gpus program start GPU NAME --gib N | stop GPU PID|NAME | list GPU
                                          simulated GPUs: another program appears, exits
    traylm fans [--gpu G] | fans presets | fans set PRESET|FILE.toml [--gpu] [--fan] | fans auto
    traylm power [--gpu G] | power set WATTS|PRESET [--gpu] | power reset [--gpu]
    traylm guard | guard set KEY=VALUE ...

Control commands go through the daemon to traylm-gpud; ``--dry-run`` only validates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engines.client import DaemonClient
from engines.errors import ConfigError, DaemonUnavailable
from engines.events.codec import to_plain
from engines.events.gpu import (
    EfficiencyProfiles,
    GPUEntry,
    GPUInfo,
    GPUOverview,
    GPUSampled,
    GPUSnapshot,
    GPUState,
    HelperStatus,
    SimulatedProgram,
)


def add_parsers(sub: Any) -> None:
    g = sub.add_parser("gpus", help="GPU telemetry (table, live view, trace recording)")
    g.add_argument("--json", action="store_true", help="print JSON")
    g.add_argument("--simulate", type=int, metavar="N", help="without a daemon: N simulated GPUs")
    g.set_defaults(func=cmd_gpus)
    gsub = g.add_subparsers(title="gpus commands", metavar="ACTION")
    s = gsub.add_parser("watch", help="live view, refreshed every sample")
    s.add_argument("--simulate", type=int, metavar="N", help="without a daemon: N simulated GPUs")
    s.set_defaults(func=cmd_gpus_watch)
    s = gsub.add_parser("record", help="record a JSONL trace (for replay and bug reports)")
    s.add_argument("file", type=Path, help="the JSONL file to write")
    s.add_argument("--seconds", type=float, default=60.0, help="how long to record (60)")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    s.add_argument("--simulate", type=int, metavar="N", help="record N simulated GPUs instead")
    s.set_defaults(func=cmd_gpus_record)
    s = gsub.add_parser(
        "program", help="simulated GPUs: another program (a game, Blender) takes memory, exits"
    )
    psub = s.add_subparsers(title="program commands", metavar="ACTION", required=True)
    s = psub.add_parser("start", help="a simulated program appears and asks for memory")
    s.add_argument("gpu", help="GPU index or UUID")
    s.add_argument("name", help="its process name, e.g. blender")
    s.add_argument("--gib", type=float, required=True, help="GiB it asks for")
    s.set_defaults(func=cmd_program_start)
    s = psub.add_parser("stop", help="a simulated program exits")
    s.add_argument("gpu", help="GPU index or UUID")
    s.add_argument("program", help="its pid or name")
    s.set_defaults(func=cmd_program_stop)
    s = psub.add_parser("list", help="the other programs on a simulated GPU")
    s.add_argument("gpu", help="GPU index or UUID")
    s.set_defaults(func=cmd_program_list)

    f = sub.add_parser("fans", help="fan curves (through traylm-gpud)")
    f.add_argument("--gpu", help="GPU index or UUID (default: all)")
    f.set_defaults(func=cmd_fans)
    fsub = f.add_subparsers(title="fans commands", metavar="ACTION")
    s = fsub.add_parser("presets", help="list the fan-curve presets")
    s.set_defaults(func=cmd_fans_presets)
    s = fsub.add_parser("set", help="apply a preset or a curve file (TOML with points = [...])")
    s.add_argument("curve", help="preset name (quiet, balanced, performance, full) or FILE.toml")
    s.add_argument("--gpu", action="append", help="GPU index or UUID (repeat; default: all)")
    s.add_argument("--fan", type=int, action="append", help="fan index (repeat; default: all)")
    s.add_argument("--temporary", action="store_true", help="until the daemon stops (no save)")
    s.add_argument("--dry-run", action="store_true", help="validate and preview only")
    s.set_defaults(func=cmd_fans_set)
    s = fsub.add_parser("auto", help="hand fans back to the firmware")
    s.add_argument("--gpu", default="all", help="GPU index or UUID (default: all)")
    s.set_defaults(func=cmd_fans_auto)

    p = sub.add_parser("power", help="GPU power limits (through traylm-gpud)")
    p.add_argument("--gpu", help="GPU index or UUID (default: all)")
    p.set_defaults(func=cmd_power)
    psub = p.add_subparsers(title="power commands", metavar="ACTION")
    s = psub.add_parser(
        "set", help="set a limit: watts (300) or a preset (efficient, balanced, stock)"
    )
    s.add_argument("value", help="watts (300) or a preset: efficient, balanced, stock")
    s.add_argument("--gpu", action="append", help="GPU index or UUID (repeat; default: all)")
    s.add_argument("--temporary", action="store_true", help="until the daemon stops (no save)")
    s.add_argument("--dry-run", action="store_true", help="validate and preview only")
    s.set_defaults(func=cmd_power_set)
    s = psub.add_parser("reset", help="back to the default limit")
    s.add_argument("--gpu", default="all", help="GPU index or UUID (default: all)")
    s.set_defaults(func=cmd_power_reset)
    s = psub.add_parser(
        "profile",
        help="apply an efficiency profile (power limit, SM clock lock, fans) to every GPU",
    )
    s.add_argument(
        "name",
        nargs="?",
        help="quiet, eco, max or one of ~/.config/traylm/efficiency/*.toml; "
        "none: list them and the one in force on each GPU",
    )
    s.set_defaults(func=cmd_power_profile)

    t = sub.add_parser("guard", help="thermal guard thresholds and recent actions")
    t.set_defaults(func=cmd_guard)
    tsub = t.add_subparsers(title="guard commands", metavar="ACTION")
    s = tsub.add_parser("set", help="e.g. guard_stop_margin_c=3 guard_enabled=true")
    s.add_argument(
        "changes", nargs="+", metavar="KEY=VALUE", help="guard settings of [gpu] to change"
    )
    s.add_argument("--dry-run", action="store_true", help="validate and preview only")
    s.set_defaults(func=cmd_guard_set)


# --------------------------------------------------------------------------- gpus


async def cmd_gpus(args: argparse.Namespace) -> int:
    overview = await _overview(args.simulate)
    if args.json:
        print(json.dumps(to_plain(overview), indent=1))
        return 0
    print(render_overview(overview))
    return 0 if overview.state == GPUState.OK else 1


async def _overview(simulate: int | None) -> GPUOverview:
    if simulate is None:
        try:
            async with await DaemonClient.connect(plain_calls=True) as c:
                return await c.gpus()
        except DaemonUnavailable:
            pass
    return await asyncio.to_thread(_local_overview, simulate)


def _local_overview(simulate: int | None) -> GPUOverview:
    """Read the GPUs in this process (no daemon): NVML, or the simulator."""
    from engines.errors import GPUUnavailable

    backend = _local_backend(simulate)
    label = "simulated" if backend.simulated else "read directly (no daemon running)"
    try:
        infos = backend.open()
        snaps = {s.uuid: s for s in backend.sample(slow=True)}
    except GPUUnavailable as exc:
        return GPUOverview(
            backend=backend.name,
            simulated=backend.simulated,
            state=GPUState.UNAVAILABLE,
            message=exc.message,
        )
    finally:
        backend.close()
    return GPUOverview(
        backend=backend.name,
        simulated=backend.simulated,
        state=GPUState.OK,
        message=label,
        gpus=tuple(GPUEntry(info=i, snapshot=snaps.get(i.uuid)) for i in infos),
        helper=HelperStatus(available=False, detail="not checked (no daemon)"),
    )


def _local_backend(simulate: int | None) -> Any:
    if simulate:
        from engines.gpu.sim import SimulatedBackend

        return SimulatedBackend(simulate)
    from engines.gpu.nvml import NVMLBackend

    return NVMLBackend()


def render_overview(o: GPUOverview) -> str:
    lines = []
    tag = " [SIMULATED]" if o.simulated else ""
    if o.state != GPUState.OK:
        return f"GPUs: {o.message}{tag}"
    width = max((len(e.info.name) for e in o.gpus), default=10) + 2
    lines.append(
        f"{'GPU':<4}{'name':<{width}}{'temp':>6}{'power/limit W':>16}{'util':>6}{'memory GiB':>14}"
        f"{'fans %':>12}  clock events{tag}"
    )
    for entry in o.gpus:
        lines.append(_gpu_line(entry.info, entry.snapshot, width))
        if entry.snapshot and entry.snapshot.processes:
            for p in entry.snapshot.processes:
                mem = f"{p.used_memory_bytes / 2**30:.1f} GiB" if p.used_memory_bytes else "?"
                who = f" engine {p.engine_id}" if p.engine_id else ""
                lines.append(f"      pid {p.pid} {p.name}{who}: {mem}")
    for e in o.energy:
        jpt = "-" if e.joules_per_token is None else f"{e.joules_per_token:.3f} J/token"
        cost = "" if e.cost_per_mtok is None else f", {e.cost_per_mtok:.3f} {e.currency}/M tokens"
        lines.append(
            f"engine {e.engine_id}: {e.power_w:.0f} W, {jpt}{cost} (last {e.window_s:.0f} s)"
        )
    if o.psu and o.psu.warning:
        lines.append(f"PSU: {o.psu.warning}")
    helper = o.helper
    if helper.available:
        lines.append(f"fan/power control: {helper.detail}")
    else:
        lines.append(f"fan/power control: read-only ({helper.detail})")
    if o.profile:
        lines.append(f"efficiency profile: {o.profile}")
    for lock in helper.clocks:
        index = next((e.info.index for e in o.gpus if e.info.uuid == lock.uuid), lock.uuid)
        kept = ", kept across restarts" if lock.persist else ""
        lines.append(
            f"clock lock: GPU {index} {lock.domain} {lock.min_mhz}-{lock.max_mhz} MHz{kept}"
        )
    for w in helper.warnings:
        lines.append(f"  warning: {w}")
    if o.paused:
        lines.append(f"PAUSED: {o.paused}")
    return "\n".join(lines)


def _gpu_line(info: GPUInfo, s: GPUSnapshot | None, width: int) -> str:
    if s is None:
        return f"{info.index:<4}{info.name:<{width}} (no sample yet)"
    if s.state == GPUState.LOST:
        return f"{info.index:<4}{info.name:<{width}} LOST: reboot needed"
    temp = "-" if s.temperature_c is None else f"{s.temperature_c}°C"
    power = f"{_w(s.power_draw_mw)}/{_w(s.power_limit_mw)}"
    util = "-" if s.utilization_gpu_pct is None else f"{s.utilization_gpu_pct}%"
    mem = (
        f"{s.memory_used_bytes / 2**30:.1f}/{s.memory_total_bytes / 2**30:.1f}"
        if s.memory_used_bytes is not None and s.memory_total_bytes
        else "-"
    )
    fans = (
        ",".join(
            ("-" if f.speed_pct is None else str(f.speed_pct)) + ("m" if f.manual else "")
            for f in s.fans
        )
        or "-"
    )
    reasons = ", ".join(r for r in s.clock_event_reasons if r != "idle")
    return (
        f"{info.index:<4}{info.name:<{width}}{temp:>6}{power:>16}{util:>6}{mem:>14}{fans:>12}"
        f"  {reasons}"
    )


def _w(mw: int | None) -> str:
    return "-" if mw is None else f"{mw / 1000:.0f}"


async def cmd_gpus_watch(args: argparse.Namespace) -> int:
    if args.simulate is None:
        try:
            c = await DaemonClient.connect(plain_calls=True)
        except DaemonUnavailable:
            c = None
        if c is not None:
            async with c:
                overview = await c.gpus()
                _redraw(render_overview(overview))
                async for event in c.events(kinds=("gpu.sample", "gpu.state", "gpu.guard")):
                    if isinstance(event, GPUSampled):
                        overview = _with_samples(overview, event.gpus)
                        _redraw(render_overview(overview) + "\n(ctrl-c to quit)")
                    else:
                        print(getattr(event, "message", "") or getattr(event, "detail", ""))
            return 0
    while True:
        overview = await asyncio.to_thread(_local_overview, args.simulate)
        _redraw(render_overview(overview) + "\n(no daemon: reading directly; ctrl-c to quit)")
        await asyncio.sleep(1.0)


def _with_samples(o: GPUOverview, snaps: Sequence[GPUSnapshot]) -> GPUOverview:
    import dataclasses

    by_uuid = {s.uuid: s for s in snaps}
    entries = tuple(
        dataclasses.replace(e, snapshot=by_uuid.get(e.info.uuid, e.snapshot)) for e in o.gpus
    )
    return dataclasses.replace(o, gpus=entries)


def _redraw(text: str) -> None:
    if sys.stdout.isatty():
        sys.stdout.write("\x1b[H\x1b[2J")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def cmd_gpus_record(args: argparse.Namespace) -> int:
    from engines.gpu.replay import record

    if args.seconds <= 0 or not 0.1 <= args.interval <= 60:
        raise ConfigError("--seconds must be positive and --interval 0.1-60")
    backend = _local_backend(args.simulate)
    costs: list[float] = []

    def progress(snaps: tuple[GPUSnapshot, ...], cost_s: float) -> None:
        costs.append(cost_s)
        temps = " ".join(f"{s.temperature_c}°C" for s in snaps)
        print(f"\r{len(costs)} samples  {temps}  ({cost_s * 1000:.1f} ms)", end="", flush=True)

    started = time.monotonic()
    try:
        count = await asyncio.to_thread(
            record,
            backend,
            args.file,
            seconds=args.seconds,
            interval_s=args.interval,
            on_sample=progress,
        )
    finally:
        backend.close()
    mean = sum(costs) / len(costs) * 1000 if costs else 0.0
    print(
        f"\nwrote {count} samples to {args.file} in {time.monotonic() - started:.0f} s "
        f"(backend {backend.name}, {mean:.2f} ms per sample)"
    )
    return 0


# --------------------------------------------------------------------------- fans


async def cmd_fans(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        overview = await c.gpus()
        for entry in overview.gpus:
            if args.gpu not in (None, str(entry.info.index), entry.info.uuid):
                continue
            status = await c.fans(entry.info.uuid)
            floor = f", floor {status.min_pct} %" if status.min_pct is not None else ""
            print(f"GPU {status.index} {status.name} ({status.uuid}){floor}")
            controls = {ctl.fan: ctl for ctl in status.controls}
            for r in status.readings:
                ctl = controls.get(r.index)
                mode = ctl.mode if ctl else ("manual (not traylm)" if r.manual else "auto")
                if ctl and ctl.curve:
                    mode = f"curve {ctl.curve.name or 'custom'}"
                kept = " (saved)" if ctl and ctl.persist else ""
                print(f"  fan {r.index}: {r.speed_pct} % (target {r.target_pct} %) {mode}{kept}")
        if not overview.helper.available:
            print(f"read-only: {overview.helper.detail}")
    return 0


async def cmd_fans_presets(args: argparse.Namespace) -> int:
    from engines.gpu.fans import load_presets

    for name, curve in (await asyncio.to_thread(load_presets)).items():
        pts = "  ".join(f"{t:g}°C→{d:g}%" for t, d in curve.points)
        print(f"{name:<12} {pts}  (hysteresis {curve.hysteresis_c:g} °C)")
    return 0


async def cmd_fans_set(args: argparse.Namespace) -> int:
    curve: dict[str, Any] | None = None
    preset: str | None = args.curve
    if args.curve.endswith(".toml"):
        path = Path(args.curve)
        try:
            curve = tomllib.loads(await asyncio.to_thread(path.read_text))
        except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError too
            raise ConfigError(f"cannot read the curve file {path}: {exc}") from None
        preset = None
    async with await DaemonClient.connect(plain_calls=True) as c:
        gpus = args.gpu or [str(e.info.index) for e in (await c.gpus()).gpus]
        for gpu in gpus:
            result = await c.set_fan_curve(
                gpu,
                preset=preset,
                curve=curve,
                fans=args.fan,
                persist=not args.temporary,
                dry_run=args.dry_run,
            )
            verb = "would apply" if args.dry_run else "applied"
            print(f"GPU {gpu}: {verb} {result.curve.name or 'custom'} on fans {list(result.fans)}")
            print(
                "  "
                + "  ".join(f"{t:g}°C:{'auto' if d == 0 else f'{d:g}%'}" for t, d in result.preview)
            )
            for w in result.warnings:
                print(f"  warning: {w}")
    return 0


async def cmd_fans_auto(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        gpus = await c.restore_fans(args.gpu)
        print(f"fans under firmware control on {len(gpus)} GPU(s)")
    return 0


# --------------------------------------------------------------------------- simulated programs


def _program_line(p: SimulatedProgram) -> str:
    held = f"holds {p.held_bytes / 2**30:.1f} GiB"
    if p.held_bytes < p.wanted_bytes:
        held += f" of the {p.wanted_bytes / 2**30:.1f} GiB it asked for (waiting for memory)"
    return f"GPU {p.gpu_index}: {p.name} (pid {p.pid}, simulated) {held}"


async def cmd_program_start(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        print(_program_line(await c.start_sim_program(args.gpu, args.name, args.gib)))
    return 0


async def cmd_program_stop(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        pids = await c.stop_sim_program(args.gpu, args.program)
    print(f"GPU {args.gpu}: {args.program} exited (pid {', '.join(map(str, pids))}, simulated)")
    return 0


async def cmd_program_list(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        for p in await c.sim_programs(args.gpu):
            print(_program_line(p))
    return 0


# --------------------------------------------------------------------------- power


async def cmd_power(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        overview = await c.gpus()
        for entry in overview.gpus:
            if args.gpu not in (None, str(entry.info.index), entry.info.uuid):
                continue
            p = await c.power_limit(entry.info.uuid)
            who = f" (set by {p.controlled_by})" if p.controlled_by else ""
            print(
                f"GPU {p.index} {p.name}: limit {_w(p.enforced_mw)} W{who}, default "
                f"{_w(p.default_mw)} W, range {_w(p.min_mw)}-{_w(p.max_mw)} W"
            )
        if not overview.helper.available:
            print(f"read-only: {overview.helper.detail}")
    return 0


async def cmd_power_set(args: argparse.Namespace) -> int:
    try:
        watts: float | None = float(args.value)
        preset = None
    except ValueError:
        watts, preset = None, args.value
    async with await DaemonClient.connect(plain_calls=True) as c:
        gpus = args.gpu or [str(e.info.index) for e in (await c.gpus()).gpus]
        for gpu in gpus:
            p = await c.set_power_limit(
                gpu, watts=watts, preset=preset, persist=not args.temporary, dry_run=args.dry_run
            )
            verb = "would set" if args.dry_run else "set"
            print(
                f"GPU {p.index}: {verb} {_w(p.requested_mw)} W "
                f"(range {_w(p.min_mw)}-{_w(p.max_mw)} W)"
            )
    return 0


async def cmd_power_profile(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        if args.name is None:
            print(render_profiles(await c.efficiency_profiles(), await c.gpus()))
            return 0
        gpus = await c.set_efficiency_profile(args.name)
        print(f"efficiency profile {args.name} on {len(gpus)} GPU(s)")
    return 0


def render_profiles(p: EfficiencyProfiles, o: GPUOverview) -> str:
    """One line per profile (its description, the GPUs it is in force on), then the user's
    files that could not be read."""
    index = {e.info.uuid: e.info.index for e in o.gpus}
    width = max((len(e.name) for e in p.profiles), default=0)
    lines = ["efficiency profiles" + (" [SIMULATED GPUs]" if p.simulated else "") + ":"]
    for e in p.profiles:
        on = sorted(index.get(u, -1) for u, name in p.in_force.items() if name == e.name)
        where = f"  [in force on GPU {', '.join(map(str, on))}]" if on else ""
        lines.append(f"  {e.name:<{width}}  {e.description}{where}")
    if not p.in_force:
        lines.append("none in force: the GPUs run as the cards or your own settings set them")
    lines.extend(f"cannot be used: {problem}" for problem in p.problems)
    return "\n".join(lines)


async def cmd_power_reset(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        gpus = await c.reset_power_limit(args.gpu)
        print(f"default power limit on {len(gpus)} GPU(s)")
    return 0


# --------------------------------------------------------------------------- guard


async def cmd_guard(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        g = await c.guard()
        print(f"thermal guard {'on' if g.enabled else 'OFF'}")
        for key, value in g.thresholds.items():
            print(f"  {key} = {value:g}")
        if g.problem:
            print(f"  problem: {g.problem}")
        for gpu in g.gpus:
            print(
                f"GPU {gpu.index}: {gpu.temperature_c} °C, slowdown {gpu.slowdown_c} °C, "
                f"step {gpu.level.name.lower()}"
            )
        for a in g.actions[-10:]:
            stamp = time.strftime("%H:%M:%S", time.localtime(a.ts_s))
            print(f"  {stamp} GPU {a.gpu_index} {a.action}: {a.detail}")
    return 0


async def cmd_guard_set(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    for item in args.changes:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r}: write KEY=VALUE, e.g. guard_stop_margin_c=3")
        try:
            changes[key.removeprefix("gpu.")] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"{item!r}: the value must be a number or true/false") from None
    async with await DaemonClient.connect(plain_calls=True) as c:
        g = await c.set_guard(changes, dry_run=args.dry_run)
        print(
            ("valid: " if args.dry_run else "saved: ")
            + ", ".join(f"{k}={v:g}" for k, v in g.thresholds.items())
        )
    return 0

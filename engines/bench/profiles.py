"""`traylm bench run --profiles quiet,eco,max`: the same benchmark (same config, same seed)
under each efficiency profile, then the profile that was in force before put back, and the
figures side by side with the noise band (engines/bench/noise.py, the tuner's).

The orchestration lives in the CLI, not in the daemon: each benchmark is already a daemon job
that the CLI follows (engines/client/follow.py), and a profile is one existing call
(``POST /api/gpus/profile``), so the sequence is a loop of calls the daemon already has. A
daemon job would survive the CLI, but would need its own store, events, routes and restart
handling for what a loop does; the price of the CLI is that a CLI killed outright (SIGKILL)
leaves the GPUs on the profile it was measuring. Ctrl-C is handled (``CtrlC``): the run in the
daemon is cancelled, then the profile before is put back; a second Ctrl-C says so and waits for
that; a third leaves, saying which profile the GPUs are left on and how to put back the other.

The profiles run interleaved round by round (quiet eco max, quiet eco max), as the tuner
interleaves its candidates, so a card warming over the session does not favour one profile.
Names are checked against the profiles of this user (engines/gpu/efficiency.py, the same files
the daemon reads) and the daemon's GPUs before anything is applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from engines.bench import noise
from engines.client import DaemonClient
from engines.core.waiting import within
from engines.errors import ConfigError, TraylmError
from engines.events.bench import BenchConfig, BenchLevel, BenchRun, BenchState
from engines.events.gpu import GPUOverview
from engines.gpu import efficiency

MAX_REPEAT = 10
RESTORE_S = 60.0  # a profile is a few helper writes per GPU, rate limited to a few a second
FALLBACK = "max"
"""What the GPUs get back when no profile was in force before: the card's defaults."""
NO_GPUS = (
    "efficiency profiles need NVIDIA GPUs, and the daemon sees none{why}; to try them "
    "without one, start the daemon on simulated GPUs: `traylm serve --simulate-gpus 2`"
)

# (figure key, column, digits)
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("output_tps", "out tok/s", 1),
    ("ttft_p50_ms", "TTFT p50 ms", 1),
    ("joules_per_token", "J/token", 3),
    ("temperature_peak_c", "peak °C", 0),
    ("fan_speed_peak_pct", "peak fan %", 0),
)


@dataclasses.dataclass(frozen=True)
class ProfileRun:
    profile: str
    round: int  # 0-based
    run: BenchRun


@dataclasses.dataclass(frozen=True)
class ProfileRow:
    """One profile at one concurrency level over its runs: the means, and each figure's noise
    band (only with two runs or more)."""

    profile: str
    concurrency: int
    runs: int
    figures: dict[str, float]
    band: dict[str, float]
    simulated: bool


def parse_profiles(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ConfigError("--profiles needs profile names, e.g. --profiles quiet,eco,max")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--profiles names {', '.join(twice)} twice; name each profile once")
    return names


def check_repeat(repeat: int) -> int:
    if not 1 <= repeat <= MAX_REPEAT:
        raise ConfigError(
            f"--repeat must be from 1 to {MAX_REPEAT} (2 or more gives the noise band)"
        )
    return repeat


async def check(c: DaemonClient, names: Sequence[str]) -> GPUOverview:
    """Refuse before anything runs: no GPUs, no traylm-gpud, an unknown name, or a profile that
    does not fit a card (a clock or power outside its range). Returns the GPUs as they are."""
    try:
        overview = await c.gpus()
    except TraylmError as exc:
        raise ConfigError(NO_GPUS.format(why=f" ({exc.message})")) from None
    if not overview.gpus:
        raise ConfigError(NO_GPUS.format(why=f" ({overview.message})" if overview.message else ""))
    if not overview.helper.available:
        raise ConfigError(
            "efficiency profiles are applied by traylm-gpud, which does not answer"
            f"{': ' + overview.helper.detail if overview.helper.detail else ''}; "
            + (
                overview.helper.install_hint
                or "install it: sudo bash installers/linux/install-gpud.sh"
            )
        )
    profiles, broken = await asyncio.to_thread(efficiency.scan_profiles)  # as the daemon reads
    for name in names:  # a broken file of a profile not asked for stops nothing
        if name in broken:
            raise ConfigError(broken[name])
    unknown = [n for n in names if n not in profiles]
    if unknown:
        raise ConfigError(
            f"no efficiency profile {', '.join(map(repr, unknown))}; "
            f"profiles: {', '.join(profiles)}"
        )
    infos = [e.info for e in overview.gpus]
    for name in names:
        efficiency.resolve(profiles[name], infos)
    return overview


class CtrlC:
    """SIGINT while profiles are benchmarked (installed over asyncio.run's own handler). The
    first cancels the command's task: the follower cancels the run in the daemon, then the
    profile before is put back. The second says that this is happening and lets it; the third
    leaves at once (KeyboardInterrupt), saying which profile the GPUs are left on."""

    def __init__(self, task: asyncio.Task[Any], back: str) -> None:
        self._task = task
        self.back = back
        self.current: str | None = None  # the profile this command last applied
        self.count = 0
        self.abandoned = False

    def __call__(self) -> None:
        self.count += 1
        if self.count == 1:
            self._task.cancel()
            return
        if self.current is None or self.current == self.back:
            raise KeyboardInterrupt  # nothing of ours is on the GPUs
        if self.count == 2:
            print(
                f"\nputting back efficiency profile {self.back} first; Ctrl-C again leaves "
                f"the GPUs on {self.current}",
                file=sys.stderr,
                flush=True,
            )
            return
        self.abandoned = True
        print(
            f"\n{left_on(self.current, self.back)}; `traylm bench cancel` stops the benchmark "
            "if it still runs",
            file=sys.stderr,
            flush=True,
        )
        raise KeyboardInterrupt


def left_on(current: str, back: str) -> str:
    return (
        f"the GPUs are left on efficiency profile {current}: "
        f"`traylm power profile {back}` puts back what was in force"
    )


async def run_profiles(
    c: DaemonClient,
    config: BenchConfig,
    names: Sequence[str],
    *,
    repeat: int,
    before: str | None,
    run_one: Callable[[BenchConfig], Awaitable[BenchRun]],
) -> tuple[list[ProfileRun], bool]:
    """Each profile in turn, ``repeat`` rounds, interleaved; stops at a run that did not end
    done. The profile ``before`` (None: FALLBACK) is put back at the end, on Ctrl-C too.
    Returns the runs and whether the put-back worked."""
    back = before or FALLBACK
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    ctrl_c = CtrlC(task, back)
    old_handler = signal.getsignal(signal.SIGINT)
    loop.add_signal_handler(signal.SIGINT, ctrl_c)
    done: list[ProfileRun] = []
    restored = True
    plan = [(rnd, name) for rnd in range(repeat) for name in names]
    try:
        for rnd, name in plan:
            if ctrl_c.current != name:
                ctrl_c.current = name  # before the call: a Ctrl-C during it still restores
                await c.set_efficiency_profile(name)
            _say(f"efficiency profile {name}: round {rnd + 1} of {repeat}")
            label = f"{config.name} {name}" if config.name else f"profile {name}"
            run = await run_one(dataclasses.replace(config, name=label))
            done.append(ProfileRun(name, rnd, run))
            if run.state != BenchState.DONE:
                _say(f"run #{run.id} ended {run.state}: the other profiles are not run")
                break
    finally:
        if not ctrl_c.abandoned and ctrl_c.current not in (None, back):
            restored = await _put_back(c, back, before, ctrl_c)
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, old_handler)
    return done, restored


async def _put_back(c: DaemonClient, back: str, before: str | None, ctrl_c: CtrlC) -> bool:
    current = ctrl_c.current or back
    try:
        await within(RESTORE_S, c.set_efficiency_profile(back))
    except (TraylmError, TimeoutError) as exc:
        why = exc.message if isinstance(exc, TraylmError) else f"no answer in {RESTORE_S:.0f} s"
        _say(f"could not put back efficiency profile {back} ({why}); {left_on(current, back)}")
        return False
    ctrl_c.current = back
    if before is None:
        _say(
            f"no efficiency profile was in force before: the GPUs are back on {back} "
            "(the card's defaults)"
        )
    else:
        _say(f"efficiency profile {back} is back in force")
    return True


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the table


def figures_of(level: BenchLevel) -> dict[str, float]:
    """A level's figures of the table; one that was not measured is left out."""
    t = level.telemetry
    ttft = level.ttft.percentiles_s.get("50")
    values: dict[str, float | None] = {
        "output_tps": level.output_throughput_tps,
        "ttft_p50_ms": ttft * 1000 if ttft is not None else None,
        "joules_per_token": t.joules_per_token,
        "temperature_peak_c": t.temperature_peak_c,
        "fan_speed_peak_pct": t.fan_speed_peak_pct,
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def rows(runs: Sequence[ProfileRun], names: Sequence[str]) -> list[ProfileRow]:
    """A row per profile and concurrency level, from the runs that ended done, in the order of
    ``names``."""
    out: list[ProfileRow] = []
    for name in names:
        mine = [r.run for r in runs if r.profile == name and r.run.state == BenchState.DONE]
        levels = sorted({lv.concurrency for run in mine for lv in run.levels})
        for conc in levels:
            measured = [
                (figures_of(lv), lv.telemetry.simulated)
                for run in mine
                for lv in run.levels
                if lv.concurrency == conc and not lv.cancelled
            ]
            figures: dict[str, float] = {}
            band: dict[str, float] = {}
            for key, _, _ in COLUMNS:
                values = [f[key] for f, _ in measured if key in f]
                if not values:
                    continue
                figures[key] = noise.mean(values)
                if len(values) > 1:
                    band[key] = noise.band(values)
            simulated = any(sim for _, sim in measured)
            out.append(ProfileRow(name, conc, len(measured), figures, band, simulated))
    return out


def cell(row: ProfileRow, key: str, digits: int) -> str:
    value = row.figures.get(key)
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    band = row.band.get(key)
    return f"{text} ±{band * 100:.0f}%" if band is not None else text


def format_table(table: Sequence[ProfileRow], runs: Sequence[ProfileRun], repeat: int) -> str:
    simulated = any(r.simulated for r in table)
    head = f"efficiency profiles, {repeat} run{'s' if repeat > 1 else ''} each, interleaved"
    if simulated:
        head += ": figures from SIMULATED GPUs (`--simulate-gpus`), not from a real card"
    grid = [["profile", "conc", *(label for _, label, _ in COLUMNS)]]
    for r in table:
        grid.append(
            [r.profile, str(r.concurrency), *(cell(r, k, d) for k, _, d in COLUMNS)]
            + (["SIM"] if r.simulated else [])
        )
    widths = [max(len(g[i]) for g in grid) for i in range(len(grid[0]))]
    lines = [head]
    for g in grid:
        shown = zip(g, widths, strict=False)  # a SIM mark past the columns
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(shown)]
        lines.append("  " + "  ".join(cells + g[len(widths) :]).rstrip())
    if repeat > 1:
        lines.append(
            f"  ±: the noise band, half the spread of each profile's runs relative to their "
            f"mean (at least {noise.MIN_BAND * 100:.0f} %); a difference inside the wider band "
            "of two rows is noise"
        )
    else:
        lines.append("  one run each: no noise band (--repeat 2 or more gives one)")
    names = list(dict.fromkeys(r.profile for r in runs))
    ids = {n: " ".join(f"#{r.run.id}" for r in runs if r.profile == n) for n in names}
    lines.append("  runs: " + ", ".join(f"{n} {i}" for n, i in ids.items()))
    return "\n".join(lines)


def as_json(
    table: Sequence[ProfileRow],
    runs: Sequence[ProfileRun],
    *,
    repeat: int,
    before: str | None,
    after: str | None,
) -> dict[str, Any]:
    return {
        "profile_before": before,
        "profile_after": after,
        "repeat": repeat,
        "simulated": any(r.simulated for r in table),
        "runs": [
            {"profile": r.profile, "round": r.round, "run_id": r.run.id, "state": str(r.run.state)}
            for r in runs
        ],
        "table": [dataclasses.asdict(r) for r in table],
    }

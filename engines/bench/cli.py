"""``traylm bench``: run a benchmark in the daemon and follow it, list, show, compare, cancel.

traylm bench run --model NAME [--url URL] [--concurrency 1,8,32] [--input-len 128
                 --output-len 128] [--requests N] [--name TEXT] [--html FILE]
                 [--profiles quiet,eco,max [--repeat 2]]
traylm bench ls
traylm bench show ID [--html FILE]
traylm bench compare ID ID... [--html FILE]
traylm bench cancel [ID]
traylm bench rm ID
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from engines.bench.compare import cell, compare, format_table
from engines.bench.metrics import DEFINITIONS
from engines.client import DaemonClient
from engines.client.follow import Followed, follow
from engines.client.model_wait import load_and_wait
from engines.errors import ConfigError
from engines.events.bench import (
    BenchConfig,
    BenchFinished,
    BenchLevel,
    BenchProgress,
    BenchRun,
    BenchState,
)
from engines.events.codec import Event, to_plain

API_KEY_ENV = "TRAYLM_API_KEY"
FILE_CONCURRENCY = 256
"""Most requests of a workload file in flight at once (its recorded pace decides the rest)."""
FINISH_POLL_S = 2.0
CANCEL_ANSWER_S = 20.0  # the daemon's stop grace for its worker (8 s, then SIGKILL) and a margin
LOAD_TIMEOUT_S = 900.0  # a cold model first: its start (a first compile) may take minutes


def add_parsers(sub: Any) -> None:
    b = sub.add_parser("bench", help="benchmark engines and settings on this machine")
    bsub = b.add_subparsers(title="bench commands", metavar="ACTION", required=True)

    s = bsub.add_parser("run", help="run a benchmark through the daemon and print the figures")
    s.add_argument("--model", required=True, help="served model name (`traylm status`)")
    s.add_argument(
        "--url",
        default="",
        help="an engine's OpenAI URL, e.g. http://127.0.0.1:PORT/v1 (default: the gateway)",
    )
    s.add_argument(
        "--workload",
        default="random",
        help="random, chat, or a file from `traylm requests export` (sent again at its "
        "recorded pace)",
    )
    s.add_argument(
        "--as-fast-as-possible",
        action="store_true",
        help="a workload file: send its requests without waiting for their recorded times",
    )
    s.add_argument(
        "--concurrency",
        default="",
        help="levels run one after the other, e.g. 1,8,32 (default 1; a workload file: "
        f"{FILE_CONCURRENCY} at most in flight)",
    )
    s.add_argument("--input-len", type=int, default=128, help="prompt tokens (random)")
    s.add_argument("--output-len", type=int, default=128, help="output tokens (random); cap (chat)")
    s.add_argument(
        "--requests",
        type=int,
        default=0,
        help="measured requests per level (default: max(32, 4 x concurrency))",
    )
    s.add_argument("--warmup", type=int, default=1, help="warm-up requests per level (left out)")
    s.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="Poisson arrivals per second (default 0: all at once, limited by --concurrency)",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random seed for prompts and arrivals (same seed: same run)",
    )
    s.add_argument("--name", default="", help="a label for this run")
    s.add_argument("--html", type=Path, help="also write the HTML report here")
    s.add_argument(
        "--profiles",
        default="",
        help="run the same benchmark under each efficiency profile (`traylm power profile`), "
        "e.g. quiet,eco,max, and print them side by side; the profile in force before is put "
        "back at the end",
    )
    s.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="--profiles: runs of each profile, interleaved (2 or more gives the noise band)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the stored run as JSON (--profiles: the runs' ids and the table)",
    )
    s.set_defaults(func=cmd_run)

    s = bsub.add_parser("ls", aliases=["list"], help="stored benchmark runs")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_ls)

    s = bsub.add_parser("show", help="one run's figures")
    s.add_argument("run_id", type=int, help="a run id (`traylm bench ls`)")
    s.add_argument("--html", type=Path, help="write the HTML report here")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_show)

    s = bsub.add_parser("compare", help="runs side by side, with ratios to the first")
    s.add_argument("run_ids", type=int, nargs="+", metavar="ID", help="run ids, the first the base")
    s.add_argument("--html", type=Path, help="write the HTML comparison here")
    s.set_defaults(func=cmd_compare)

    s = bsub.add_parser("cancel", help="stop the running benchmark (keeps what finished)")
    s.add_argument("run_id", type=int, nargs="?", help="default: the running one")
    s.set_defaults(func=cmd_cancel)

    s = bsub.add_parser("rm", aliases=["remove"], help="delete a stored run")
    s.add_argument("run_id", type=int, help="a run id (`traylm bench ls`)")
    s.set_defaults(func=cmd_rm)


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--concurrency {text!r}: give whole numbers, e.g. 1,8,32") from None
    if not levels:
        raise ConfigError("--concurrency needs at least one level, e.g. 1,8,32")
    return levels


async def _client() -> DaemonClient:
    return await DaemonClient.connect(plain_calls=True)


# --------------------------------------------------------------------------- run


def _workload(args: argparse.Namespace) -> tuple[str, str]:
    """(workload, its file's absolute path or "")."""
    from engines.bench.prompts import WORKLOADS  # aiohttp: only for `bench run`

    if args.workload in WORKLOADS:
        return args.workload, ""
    path = Path(args.workload).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(
            f"--workload {args.workload!r} is neither {' nor '.join(WORKLOADS)} nor a file; "
            "`traylm requests export FILE` writes one"
        )
    return "file", str(path)


async def cmd_run(args: argparse.Namespace) -> int:
    workload, workload_file = _workload(args)
    default_levels = str(FILE_CONCURRENCY) if workload_file else "1"
    config = BenchConfig(
        model=args.model,
        url=args.url,
        workload=workload,
        workload_file=workload_file,
        as_fast_as_possible=args.as_fast_as_possible,
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=parse_levels(args.concurrency or default_levels),
        requests=args.requests,
        warmup=args.warmup,
        rate_rps=args.rate,
        seed=args.seed,
        name=args.name,
    )
    if args.profiles:
        return await _run_profiles(args, config)
    async with await _client() as c:
        if not config.url:
            await _load_if_cold(c, config.model)
        final = await _run_one(c, config)
        _print_or_json(final, args.json)
        if args.html:
            await _write_html(c, [final.id], args.html)
    return 0 if final.state == BenchState.DONE else 1


async def _run_one(c: DaemonClient, config: BenchConfig) -> BenchRun:
    """One run in the daemon, followed to its end (Ctrl-C cancels it)."""
    api_key = os.environ.get(API_KEY_ENV, "")
    return await follow(
        c,
        followed(c),
        lambda: c.bench_start(config, api_key=api_key),
        started=lambda run: print(
            f"benchmark run #{run.id} started against {run.target}", file=sys.stderr
        ),
    )


async def _run_profiles(args: argparse.Namespace, config: BenchConfig) -> int:
    """--profiles: engines/bench/profiles.py; 130 after a Ctrl-C (the profile before put back)."""
    from engines.bench import profiles  # the efficiency profiles: only for --profiles

    names = profiles.parse_profiles(args.profiles)
    repeat = profiles.check_repeat(args.repeat)
    async with await _client() as c:
        overview = await profiles.check(c, names)
        if not config.url:
            await _check_served(c, config.model)  # refused before a profile is applied
        before = overview.profile
        if before is None:
            print(
                "no efficiency profile is in force: the GPUs end on "
                f"{profiles.FALLBACK} (the card's defaults)",
                file=sys.stderr,
            )
        if not config.url:
            await _load_if_cold(c, config.model)
        try:
            runs, restored = await profiles.run_profiles(
                c, config, names, repeat=repeat, before=before, run_one=lambda k: _run_one(c, k)
            )
        except asyncio.CancelledError:
            return 130  # Ctrl-C: the run was cancelled and the profile before put back
        table = profiles.rows(runs, names)
        after = (await c.gpus()).profile
        if args.json:
            data = profiles.as_json(table, runs, repeat=repeat, before=before, after=after)
            print(json.dumps(data, indent=1))
        else:
            print(profiles.format_table(table, runs, repeat))
        if args.html and runs:
            await _write_html(c, [r.run.id for r in runs], args.html)
    finished = len(runs) == len(names) * repeat and all(
        r.run.state == BenchState.DONE for r in runs
    )
    return 0 if finished and restored else 1


def followed(c: DaemonClient) -> Followed[BenchRun, int]:
    """How `bench run` follows its run (engines/client/follow.py); Ctrl-C stops the run and
    keeps what finished."""
    return Followed(
        kinds=("bench",),
        job_id=lambda run: run.id,
        line=_line,
        ends=lambda e, run_id: isinstance(e, BenchFinished) and e.summary.id == run_id,
        now=c.bench_run,
        running=lambda run: run.state == BenchState.RUNNING,
        cancel=c.bench_cancel,  # the daemon stops its worker within its grace, then kills it
        stopping="stopping the benchmark...",
        cancel_answer_s=CANCEL_ANSWER_S,
        poll_s=FINISH_POLL_S,
        disown="the daemon did not confirm in time; `traylm bench cancel` stops the run if "
        "it still goes on",
    )


def _line(event: Event, run_id: int) -> tuple[str, bool]:
    if isinstance(event, BenchProgress) and event.run_id == run_id:
        return _progress_line(event), event.phase == "measure"
    return "", False


async def _load_if_cold(c: DaemonClient, model: str) -> None:
    """A servable model that is not loaded (models on demand) is loaded first, its progress
    said on stderr, so the measurement starts on a ready engine and never includes its start."""
    servable = await c.servable_models()
    entry = next((m for m in servable if model == m.name or model in m.names), None)
    if entry is None or entry.status == "loaded" or entry.external:
        return  # unknown names get the daemon's "not served" answer, which lists them
    print(f"{model} is not loaded: loading it first", file=sys.stderr, flush=True)
    await load_and_wait(
        c, model, timeout_s=LOAD_TIMEOUT_S, say=lambda line: print(line, file=sys.stderr)
    )


async def _check_served(c: DaemonClient, model: str) -> None:
    servable = await c.servable_models()
    if not any(model == m.name or model in m.names for m in servable):
        listing = ", ".join(sorted(m.name for m in servable)) or "none"
        raise ConfigError(f"the model {model!r} is not served here; servable: {listing}")


def _progress_line(p: BenchProgress) -> str:
    head = f"[level {p.level_index + 1}/{p.levels_total}, concurrency {p.concurrency}]"
    if p.phase == "measure":
        return (
            f"{head} {p.completed + p.failed}/{p.total} done ({p.failed} failed), "
            f"{p.output_throughput_tps:.1f} output tok/s, {p.elapsed_s:.0f} s"
        )
    return f"{head} {p.phase}"


# --------------------------------------------------------------------------- show, ls


def _ms(value: float | None) -> str:
    return cell(value * 1000 if value is not None else None, 1)


def _pcts(stats: Any) -> str:
    return f"{_ms(stats.percentiles_s.get('50'))}/{_ms(stats.percentiles_s.get('99'))}"


def format_run(run: BenchRun) -> str:
    c = run.config
    e = run.engine
    engine = f"{e.get('engine')} {e.get('version')} ({e.get('device')})" if e else "engine ?"
    lines = [
        f"run #{run.id}{' ' + repr(run.name) if run.name else ''}: {run.state}"
        + (f" ({run.detail})" if run.detail else ""),
        f"  {c.model} via {run.target} [{engine}], {c.workload} in {c.input_len} / out "
        f"{c.output_len} tokens, prompts: {run.prompt_source or '-'}",
        "  conc  done fail   req/s  out tok/s  tot tok/s  TTFT p50/p99 ms  TPOT p50/p99 ms"
        "  ITL p50/p99 ms  E2EL p50/p99 ms  peak°C  mean W   J/tok  VRAM GiB",
    ]
    for lv in run.levels:
        lines.append(_level_line(lv))
    for lv in run.levels:
        t = lv.telemetry
        lines.append(
            f"  concurrency {lv.concurrency}: tokens in from {lv.input_tokens_source or '-'}, "
            f"out from {lv.output_tokens_source or '-'}; GPUs: {t.detail or '-'}"
        )
        for message, count in lv.errors.items():
            lines.append(f"    {count} x {message}")
    failed = run.state == BenchState.FAILED or any(lv.failed for lv in run.levels)
    if run.log_path and failed:
        lines.append(
            f"  log (each failed request; `traylm requests ls --client bench`): {run.log_path}"
        )
    lines.append(f"  {DEFINITIONS}")
    return "\n".join(lines)


def _level_line(lv: BenchLevel) -> str:
    t = lv.telemetry
    vram = (
        cell(t.memory_used_peak_bytes / 1024**3, 2) if t.memory_used_peak_bytes is not None else "-"
    )
    return (
        f"  {lv.concurrency:>4} {lv.completed:>5} {lv.failed:>4} "
        f"{lv.request_throughput_rps:>7.2f} {lv.output_throughput_tps:>10.1f} "
        f"{lv.total_throughput_tps:>10.1f} {_pcts(lv.ttft):>16} {_pcts(lv.tpot):>16} "
        f"{_pcts(lv.itl):>15} {_pcts(lv.e2el):>16} {cell(t.temperature_peak_c, 0):>7} "
        f"{cell(t.power_mean_w, 1):>7} {cell(t.joules_per_token, 3):>7} {vram:>9}"
        + (" (cancelled)" if lv.cancelled else "")
        + (" SIM" if t.simulated else "")
    )


def _print_or_json(run: BenchRun, as_json: bool) -> None:
    if as_json:
        print(json.dumps(to_plain(run), indent=1))
    else:
        print(format_run(run))


async def _write_html(c: DaemonClient, run_ids: list[int], path: Path) -> None:
    html = await c.bench_report_html(run_ids)
    await asyncio.to_thread(path.write_text, html, encoding="utf-8")
    print(f"report written to {path}", file=sys.stderr)


async def cmd_ls(args: argparse.Namespace) -> int:
    async with await _client() as c:
        runs = await c.bench_runs()
    if args.json:
        print(json.dumps(to_plain(runs), indent=1))
        return 0
    if not runs:
        print("no benchmark runs yet; `traylm bench run --model NAME` starts one")
        return 0
    print(
        f"{'id':>4}  {'started':<16}  {'state':<11} {'model':<16} {'levels':<12} "
        f"{'best out tok/s':>15}  {'J/tok':>7}  name"
    )
    for r in runs:
        when = datetime.datetime.fromtimestamp(r.created_s).strftime("%Y-%m-%d %H:%M")
        best = (
            f"{r.best_output_throughput_tps:.1f} @{r.best_concurrency}"
            if r.best_output_throughput_tps is not None
            else "-"
        )
        levels = ",".join(map(str, r.concurrency))
        jpt = cell(r.joules_per_token, 3) + ("*" if r.simulated else "")
        print(
            f"{r.id:>4}  {when:<16}  {r.state:<11} {r.model[:16]:<16} {levels[:12]:<12} "
            f"{best:>15}  {jpt:>7}  {r.name}"
        )
    if any(r.simulated for r in runs):
        print("* energy from simulated GPUs")
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with await _client() as c:
        run = await c.bench_run(args.run_id)
        _print_or_json(run, args.json)
        if args.html:
            await _write_html(c, [run.id], args.html)
    return 0


async def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.run_ids) < 2:
        raise ConfigError("compare needs two runs or more: `traylm bench compare 3 5`")
    async with await _client() as c:
        runs = [await c.bench_run(i) for i in args.run_ids]
        print(format_table(compare(runs)))
        if args.html:
            await _write_html(c, [r.id for r in runs], args.html)
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with await _client() as c:
        run_id = args.run_id
        if run_id is None:
            current, _ = await c.bench_current()
            if current is None:
                print("no benchmark is running")
                return 0
            run_id = current.id
        done = await c.bench_cancel(run_id)
        print(f"run #{done.id}: {done.state}")
    return 0


async def cmd_rm(args: argparse.Namespace) -> int:
    async with await _client() as c:
        await c.bench_delete(args.run_id)
        print(f"deleted run #{args.run_id}")
    return 0

"""``traylm tune``: find this machine's best settings for a model, by measurement, in the daemon.

traylm tune MODEL [--workload FILE.jsonl | --preset chat|rag|agent|batch]
           [--goal latency|throughput|efficiency|quiet] [--budget 20m] [--repeat 2]
           [--only KEY,KEY] [--requests N] [--concurrency N] [--apply] [--html FILE] [--json]
traylm tune --undo MODEL      put back the profile `--apply` replaced
traylm tune --cancel          stop the running tune (what ran before is started again)
traylm tune --targets         what can be tuned on this computer (profiles, model folders,
                              downloaded models), and what cannot start here and why

MODEL is any of those, as it is: the tuner makes the candidate profiles it measures itself.

Ctrl-C while it runs cancels the tune in the daemon, which stops the candidate and starts again
the engines that ran before.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from engines.client import DaemonClient
from engines.config.fields import parse_duration
from engines.core.waiting import within
from engines.errors import ConfigError, TraylmError
from engines.events.codec import to_plain
from engines.events.tune import (
    TuneConfig,
    TuneFinished,
    TuneJob,
    TuneProgress,
    TuneState,
    TuneTarget,
)

FINISH_POLL_S = 5.0
CANCEL_ANSWER_S = 300.0  # the restore starts the engines that ran before


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "tune",
        help="measure candidate settings for a model on this machine and recommend one",
        description=(__doc__ or "").replace("``", ""),  # plain text in a terminal
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "model", nargs="?", help="a profile, a model folder or a downloaded model (--targets)"
    )
    add_workload_arguments(s, runs_of="candidate")
    s.add_argument("--goal", default="throughput", help="latency, throughput, efficiency, quiet")
    s.add_argument("--only", default="", help="candidate keys to try, e.g. max-num-seqs-64")
    s.add_argument("--apply", action="store_true", help="write the recommended profile")
    s.add_argument("--undo", action="store_true", help="put back the profile --apply replaced")
    s.add_argument("--cancel", action="store_true", help="stop the running tune")
    s.add_argument("--targets", action="store_true", help="list what can be tuned here")
    s.add_argument("--html", type=Path, help="also write the HTML report here")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=cmd_tune)


def add_workload_arguments(s: argparse.ArgumentParser, *, runs_of: str) -> None:
    """The measurement's options (`traylm tune`, `traylm engines upgrade`): workload, budget,
    repeats; ``workload_file`` reads them."""
    s.add_argument("--workload", type=Path, help="a file from `traylm requests export` (JSONL)")
    s.add_argument("--preset", default="", help="chat (default), rag, agent or batch")
    s.add_argument("--budget", default="20m", help="time for the measurements (default 20m)")
    s.add_argument("--repeat", type=int, default=2, help=f"runs of each {runs_of} (at least 2)")
    s.add_argument("--requests", type=int, default=0, help="requests per run (default: preset's)")
    s.add_argument("--concurrency", type=int, default=0, help="in flight (default: preset's)")


def workload_file(args: argparse.Namespace) -> str:
    """--workload as an absolute path ("" without one); ConfigError when it is not a file or
    comes with --preset."""
    if args.workload is not None and args.preset:
        raise ConfigError("give --workload FILE or --preset NAME, not both")
    if args.workload is None:
        return ""
    path = args.workload.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"no workload file {path}; `traylm requests export FILE` writes one")
    return str(path)


def config_of(args: argparse.Namespace) -> TuneConfig:
    """The TuneConfig the command line asks for; ConfigError for what is wrong in it."""
    if not args.model:
        raise ConfigError("name the model to tune: `traylm tune PROFILE` (`traylm profiles`)")
    recorded = workload_file(args)
    return TuneConfig(
        model=args.model,
        workload="file" if recorded else (args.preset or "chat"),
        workload_file=recorded,
        goal=args.goal,
        budget_s=parse_duration(args.budget, what="--budget"),
        repeat=args.repeat,
        apply=args.apply,
        requests=args.requests,
        concurrency=args.concurrency,
        only=tuple(k.strip() for k in args.only.split(",") if k.strip()),
    )


async def cmd_tune(args: argparse.Namespace) -> int:
    if args.targets:
        async with await DaemonClient.connect(plain_calls=True) as c:
            print(format_targets(*await c.tune_targets()))
        return 0
    if args.cancel:
        async with await DaemonClient.connect(plain_calls=True) as c:
            job = await c.tune_cancel(timeout_s=CANCEL_ANSWER_S)
        print(f"tune #{job.id} of {job.profile}: {job.state}")
        return 0
    if args.undo:
        if not args.model:
            raise ConfigError("name the profile: `traylm tune --undo PROFILE`")
        async with await DaemonClient.connect(plain_calls=True) as c:
            print(await c.tune_undo(args.model))
        return 0
    config = config_of(args)
    async with await DaemonClient.connect(plain_calls=True) as c:
        queue: asyncio.Queue[TuneProgress | TuneFinished] = asyncio.Queue()
        follower = asyncio.create_task(_follow(c, queue))
        try:
            job = await c.tune_start(config)
            print(f"tune #{job.id} of {job.profile} started; {len(job.dropped)} candidate(s) "
                  "left out before it began", file=sys.stderr)  # fmt: skip
            for line in job.dropped:
                print(f"  {line}", file=sys.stderr)
            try:
                await _wait(c, job.id, queue)
            except asyncio.CancelledError:  # Ctrl-C: the daemon restores what ran before
                print("\nstopping the tune and restoring what ran before...", file=sys.stderr)
                with contextlib.suppress(TraylmError, TimeoutError):
                    await within(CANCEL_ANSWER_S, c.tune_cancel())
                raise
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, TraylmError):
                await follower
        final = await c.tune_current()
        assert final is not None
        _print(final, args.json)
        if args.html:
            args.html.write_text(await c.tune_report_html(), encoding="utf-8")
            print(f"report: {args.html}", file=sys.stderr)
    return 0 if final.state == TuneState.DONE else 1


async def _follow(c: DaemonClient, queue: asyncio.Queue[TuneProgress | TuneFinished]) -> None:
    async for event in c.events(kinds=("tune",)):
        if isinstance(event, TuneProgress | TuneFinished):
            queue.put_nowait(event)


async def _wait(
    c: DaemonClient, job_id: int, queue: asyncio.Queue[TuneProgress | TuneFinished]
) -> None:
    """Print each step until the tune ends (events, with a poll in case the end was missed)."""
    while True:
        try:
            event = await within(FINISH_POLL_S, queue.get())
        except TimeoutError:
            job = await c.tune_current()
            if job is None or job.id != job_id or job.state != TuneState.RUNNING:
                return
            continue
        if isinstance(event, TuneFinished):
            if event.job_id == job_id:
                return
            continue
        if event.job_id == job_id:
            print(f"[{event.step}/{event.steps}, {event.elapsed_s:.0f}/{event.budget_s:.0f} s] "
                  f"{event.detail}", file=sys.stderr, flush=True)  # fmt: skip


def format_targets(can: tuple[TuneTarget, ...], cannot: tuple[TuneTarget, ...]) -> str:
    """`traylm tune --targets`: one line each, those that cannot start here after, with why."""
    lines = [f"{t.name}  ({t.kind}, serves {t.served_name}{', loaded' * t.loaded})" for t in can]
    lines = lines or ["nothing can be tuned here: add a model folder or a profile"]
    if cannot:
        lines += ["", "cannot start here:"]
        lines += [f"  {t.name}  ({t.kind}): {t.blocked}" for t in cannot]
    return "\n".join(lines)


def _print(job: TuneJob, as_json: bool) -> None:
    if as_json:
        print(json.dumps(to_plain(job), indent=1))
        return
    from engines.tune.table import format_job

    print(format_job(job))

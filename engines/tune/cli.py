"""``traylm tune``: find this machine's best settings for a model, by measurement, in the daemon.

traylm tune MODEL [--workload FILE.jsonl | --preset chat|rag|agent|batch]
           [--goal latency|throughput|efficiency|quiet] [--budget 20m] [--repeat 2]
           [--only KEY,KEY] [--requests N] [--concurrency N] [--apply] [--html FILE] [--json]
traylm tune --undo MODEL      put back the profile `--apply` replaced
traylm tune cancel            stop the running tune (what ran before is started again);
                              `traylm tune --cancel`, the old form, does the same
traylm tune --targets         what can be tuned on this computer (profiles, model folders,
                              downloaded models), and what cannot start here and why

MODEL is any of those, as it is: the tuner makes the candidate profiles it measures itself.

Ctrl-C while it runs cancels the tune in the daemon, which stops the candidate and starts again
the engines that ran before.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engines.client import DaemonClient
from engines.client.follow import Followed, follow
from engines.config.fields import parse_duration
from engines.errors import ConfigError
from engines.events.codec import Event, to_plain
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
        "model",
        nargs="?",
        help="a profile, a model folder or a downloaded model (--targets); cancel: stop the tune",
    )
    add_workload_arguments(s, runs_of="candidate")
    s.add_argument("--goal", default="throughput", help="latency, throughput, efficiency, quiet")
    s.add_argument("--only", default="", help="candidate keys to try, e.g. max-num-seqs-64")
    s.add_argument("--apply", action="store_true", help="write the recommended profile")
    s.add_argument("--undo", action="store_true", help="put back the profile --apply replaced")
    s.add_argument("--cancel", action="store_true", help="the old form of `traylm tune cancel`")
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
    if args.cancel or (args.model == "cancel" and not args.undo):
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
        final = await follow(c, followed(c), lambda: c.tune_start(config), started=_started)
        _print(final, args.json)
        if args.html:
            args.html.write_text(await c.tune_report_html(), encoding="utf-8")
            print(f"report: {args.html}", file=sys.stderr)
    return 0 if final.state == TuneState.DONE else 1


def followed(c: DaemonClient) -> Followed[TuneJob, int]:
    """How `traylm tune` follows its job (engines/client/follow.py); Ctrl-C cancels the tune
    in the daemon, which stops the candidate and starts again what ran before."""

    async def now(job_id: int) -> TuneJob | None:
        job = await c.tune_current()
        return job if job is not None and job.id == job_id else None

    return Followed(
        kinds=("tune",),
        job_id=lambda job: job.id,
        line=_line,
        ends=lambda e, job_id: isinstance(e, TuneFinished) and e.job_id == job_id,
        now=now,
        running=lambda job: job.state == TuneState.RUNNING,
        cancel=lambda _: c.tune_cancel(timeout_s=CANCEL_ANSWER_S),
        stopping="stopping the tune and restoring what ran before...",
        cancel_answer_s=CANCEL_ANSWER_S,
        poll_s=FINISH_POLL_S,
    )


def _started(job: TuneJob) -> None:
    left_out = f"{len(job.dropped)} candidate(s) left out before it began"
    print(f"tune #{job.id} of {job.profile} started; {left_out}", file=sys.stderr)
    for line in job.dropped:
        print(f"  {line}", file=sys.stderr)


def _line(event: Event, job_id: int) -> tuple[str, bool]:
    if isinstance(event, TuneProgress) and event.job_id == job_id:
        where = f"{event.step}/{event.steps}, {event.elapsed_s:.0f}/{event.budget_s:.0f} s"
        return f"[{where}] {event.detail}", False
    return "", False


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

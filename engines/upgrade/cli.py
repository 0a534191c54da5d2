"""``traylm engines upgrade``: a new engine version, taken only if it is not worse.

traylm engines upgrade ENGINE [--cpu] [--version V] [--model PROFILE]
                       [--workload FILE.jsonl | --preset chat|rag|agent|batch]
                       [--budget 20m] [--repeat 2] [--requests N] [--concurrency N] [--json]
traylm engines upgrade ENGINE --undo   profiles that name no version go back to the old one
traylm engines upgrade cancel          stop the running upgrade (what ran before runs again);
                                       `--cancel`, the old form, does the same

The daemon installs the new version (the newest on the package index: a real upgrade downloads
from PyPI, or NVIDIA's index for TensorRT-LLM) beside the one in use, measures one of your
profiles on both with the tuner's workload, and switches only if no pinned figure (TTFT p50/p95,
TPOT, tokens/s, requests/s, failed requests; VRAM and J/token on GPUs) got worse by more than
5 % or its noise band. Otherwise the old version stays, and the new one stays installed but
held back. Exit code 0: switched, or nothing newer; 1: kept, failed or cancelled.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engines.client import DaemonClient
from engines.client.follow import Followed, follow
from engines.config.fields import parse_duration
from engines.errors import ConfigError
from engines.events.codec import Event, to_plain
from engines.events.core import EnvInstallProgress
from engines.events.tune import TuneProgress
from engines.events.upgrade import UpgradeConfig, UpgradeFinished, UpgradeJob, UpgradeProgress
from engines.events.upgrade import UpgradeState as State
from engines.tune.cli import add_workload_arguments, workload_file

POLL_S = 5.0
CANCEL_ANSWER_S = 300.0  # the restore starts the engines that ran before
GOOD = (State.SWITCHED, State.CURRENT)


def add_engine_parsers(esub: Any) -> None:
    """Under `traylm engines`."""
    s = esub.add_parser(
        "upgrade",
        help="install a newer engine version and switch to it only if it is not slower",
        description=(__doc__ or "").replace("``", ""),  # plain text in a terminal
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "engine", nargs="?", help="vllm, sglang or trtllm; cancel: stop the running upgrade"
    )
    s.add_argument("--cpu", action="store_true", help="the CPU build (default without a GPU)")
    s.add_argument(
        "--version",
        dest="engine_version",
        default="",
        help="the version to try (default: the newest on the package index)",
    )
    s.add_argument("--model", default="", help="the profile to measure (default: one running)")
    add_workload_arguments(s, runs_of="version")
    s.add_argument("--undo", action="store_true", help="go back to the version before")
    s.add_argument(
        "--cancel", action="store_true", help="the old form of `traylm engines upgrade cancel`"
    )
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=cmd_upgrade)


def config_of(args: argparse.Namespace) -> UpgradeConfig:
    """The UpgradeConfig the command line asks for; ConfigError for what is wrong in it."""
    recorded = workload_file(args)
    return UpgradeConfig(
        engine=args.engine,
        device="cpu" if args.cpu else "auto",
        version=args.engine_version,
        model=args.model,
        workload="file" if recorded else args.preset,
        workload_file=recorded,
        budget_s=parse_duration(args.budget, what="--budget"),
        repeat=args.repeat,
        requests=args.requests,
        concurrency=args.concurrency,
    )


async def cmd_upgrade(args: argparse.Namespace) -> int:
    if args.cancel or args.engine == "cancel":
        async with await DaemonClient.connect(plain_calls=True) as c:
            job = await c.upgrade_cancel(timeout_s=CANCEL_ANSWER_S)
        print(f"upgrade #{job.id} of {job.engine}: {job.state}: {job.detail}")
        return 0
    if not args.engine:
        raise ConfigError("name the engine: `traylm engines upgrade vllm` (or sglang, trtllm)")
    if args.undo:
        async with await DaemonClient.connect(plain_calls=True) as c:
            print(await c.upgrade_undo(args.engine, "cpu" if args.cpu else "auto"))
        return 0
    config = config_of(args)
    async with await DaemonClient.connect(plain_calls=True) as c:
        print(f"looking up {args.engine} {config.version or '(newest)'}...", file=sys.stderr)
        job = await follow(c, followed(c), lambda: c.upgrade_start(config), started=_started)
    print(json.dumps(to_plain(job), indent=1) if args.json else format_upgrade(job))
    return 0 if job.state in GOOD else 1


def followed(c: DaemonClient) -> Followed[UpgradeJob, int]:
    """How `traylm engines upgrade` follows its job (engines/client/follow.py): its steps, the
    install's lines, the measurement's; Ctrl-C cancels it and what ran before runs again."""

    async def now(job_id: int) -> UpgradeJob | None:
        job = await c.upgrade_current()
        return job if job is not None and job.id == job_id else None

    return Followed(
        kinds=("upgrade", "tune", "env.install"),
        job_id=lambda job: job.id,
        line=lambda event, job_id: (_line(event, job_id), False),
        ends=lambda e, job_id: isinstance(e, UpgradeFinished) and e.job_id == job_id,
        now=now,
        running=lambda job: job.state == State.RUNNING,
        cancel=lambda _: c.upgrade_cancel(timeout_s=CANCEL_ANSWER_S),
        stopping="stopping the upgrade; what ran before starts again...",
        cancel_answer_s=CANCEL_ANSWER_S,
        poll_s=POLL_S,
    )


def _started(job: UpgradeJob) -> None:
    if job.state == State.RUNNING:
        what = f"{job.engine} {job.old_version} → {job.new_version}"
        print(
            f"upgrade #{job.id}: {what}, measured on profile {job.profile} ({job.workload})",
            file=sys.stderr,
        )


def _line(event: Event, job_id: int) -> str:
    if isinstance(event, UpgradeProgress) and event.job_id == job_id:
        return f"[{event.elapsed_s:.0f} s] {event.phase}: {event.detail}"
    if isinstance(event, EnvInstallProgress) and event.line:
        return f"  install: {event.line}"
    if isinstance(event, TuneProgress):
        return f"  [{event.step}/{event.steps}] {event.detail}"
    return ""


def format_upgrade(job: UpgradeJob) -> str:
    from engines.tune.table import table_lines

    lines = [f"upgrade #{job.id} of {job.engine} ({job.device}): {job.state}"]
    if job.tune is not None:
        lines.append(
            f"  {job.profile}, workload {job.workload}, concurrency "
            f"{job.tune.concurrency}, {job.tune.config.repeat} runs each, interleaved; "
            "±: noise band"
        )
        lines += table_lines(job.tune)
    lines.append(job.detail)
    return "\n".join(lines)

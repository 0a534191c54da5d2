"""`traylm batches ls|show|cancel`: the batches clients sent to the gateway (OpenAI's Batch
API at :8000), every caller's; `show --follow` follows one to its end as `traylm bench run`
follows a benchmark (engines/client/follow.py)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from engines.client import DaemonClient
from engines.client.follow import Followed, follow
from engines.events.batch import BatchFinished, BatchProgress
from engines.events.codec import Event

OPEN = ("validating", "in_progress", "finalizing", "cancelling")
CANCEL_ANSWER_S = 60.0
FINISH_POLL_S = 5.0
Batch = dict[str, Any]


def add_parsers(sub: Any) -> None:
    b = sub.add_parser("batches", help="OpenAI batches sent to the gateway (POST /v1/batches)")
    bsub = b.add_subparsers(title="batches commands", metavar="ACTION", required=True)
    s = bsub.add_parser("ls", aliases=["list"], help="batches, newest first, with their counts")
    s.add_argument("--limit", type=int, default=50, help="most batches listed (50)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_ls)
    s = bsub.add_parser("show", help="one batch: its status, counts and files")
    s.add_argument("id", help="a batch id (batch_..., from `traylm batches ls`)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow it to its end (Ctrl-C cancels it; what finished is kept)",
    )
    s.set_defaults(func=cmd_show)
    s = bsub.add_parser("cancel", help="stop a batch; what finished is kept in its files")
    s.add_argument("id", help="a batch id (batch_..., from `traylm batches ls`)")
    s.set_defaults(func=cmd_cancel)


def counts_text(b: Batch) -> str:
    c = b.get("request_counts") or {}
    failed = f", {c.get('failed', 0)} failed" if c.get("failed") else ""
    return f"{c.get('completed', 0)}/{c.get('total', 0)} done{failed}"


def batch_line(b: Batch) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b["created_at"]))
    model = b.get("model") or "several models"
    return f"{b['id']}  {when}  {b['status']:<11} {counts_text(b):<24} {b['endpoint']:<21} {model}"


def show_text(b: Batch) -> str:
    rows = [
        ("batch", b["id"]),
        ("status", b["status"]),
        ("requests", counts_text(b)),
        ("endpoint", b["endpoint"]),
        ("model", b.get("model") or "several models"),
        ("input file", b["input_file_id"]),
        ("output file", b.get("output_file_id") or "-"),
        ("error file", b.get("error_file_id") or "-"),
    ]
    for error in (b.get("errors") or {}).get("data") or []:
        rows.append(("error", str(error.get("message", ""))))
    return "\n".join(f"{k:<12} {v}" for k, v in rows)


async def cmd_ls(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect() as client:
        rows = await client.batches_list(limit=args.limit)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no batches (a client sends them to POST /v1/batches; see docs/how-to/batches.md)")
    for b in rows:
        print(batch_line(b))
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as c:
        if args.follow:
            batch = await follow(c, followed(c), lambda: c.batch(args.id))
        else:
            batch = await c.batch(args.id)
    print(json.dumps(batch, indent=1) if args.json else show_text(batch))
    return 0 if batch["status"] not in ("failed", "expired") else 1


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect() as c:
        batch = await c.batch_cancel(args.id)
    print(f"{batch['id']}: {batch['status']}, {counts_text(batch)} kept")
    return 0


def followed(c: DaemonClient) -> Followed[Batch, str]:
    """How `batches show --follow` follows a batch; Ctrl-C cancels it (what finished stays)."""
    return Followed(
        kinds=("batch",),
        job_id=lambda b: str(b["id"]),
        line=_line,
        ends=lambda e, batch_id: isinstance(e, BatchFinished) and e.batch_id == batch_id,
        now=c.batch,
        running=lambda b: b["status"] in OPEN,
        cancel=c.batch_cancel,
        stopping="cancelling batch {id} (what finished is kept)...",
        cancel_answer_s=CANCEL_ANSWER_S,
        poll_s=FINISH_POLL_S,
        disown="the daemon did not confirm in time; `traylm batches cancel` stops it",
    )


def _line(event: Event, batch_id: str) -> tuple[str, bool]:
    if isinstance(event, BatchProgress) and event.batch_id == batch_id:
        failed = f", {event.failed} failed" if event.failed else ""
        return f"{event.status}: {event.completed}/{event.total} done{failed}", True
    return "", False

"""`traylm requests ls|show|tail|export|replay`: the flight recorder's requests."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from engines.client import DaemonClient
from engines.errors import ConfigError, ControlAPIError
from engines.events.gateway import CLIENTS

TAIL_POLL_S = 1.0


def add_parsers(sub: Any) -> None:
    r = sub.add_parser("requests", help="requests recorded by the gateway (the flight recorder)")
    rsub = r.add_subparsers(title="requests commands", metavar="ACTION", required=True)
    s = rsub.add_parser("ls", aliases=["list"], help="recorded requests, newest first")
    _filters(s)
    s.add_argument("--limit", type=int, default=50, help="most requests listed (50)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_ls)
    s = rsub.add_parser("show", help="one request: who, what, the body, the reply, timings")
    s.add_argument("id", help="a request id (x-request-id, or from `traylm requests ls`)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument(
        "--prompt", action="store_true", help="also the prompt as the engine templated it"
    )
    s.set_defaults(func=cmd_show)
    s = rsub.add_parser("tail", help="requests as they are recorded")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing new ones")
    _filters(s)
    s.set_defaults(func=cmd_tail)
    s = rsub.add_parser(
        "export", help="replayable requests as OpenAI Batch input JSONL (to FILE or stdout)"
    )
    s.add_argument("file", nargs="?", default="-", help="where to write (default -: stdout)")
    s.set_defaults(func=cmd_export)
    s = rsub.add_parser("replay", help="send a recorded request again through the gateway")
    s.add_argument("id", help="a request id (x-request-id, or from `traylm requests ls`)")
    s.add_argument("--model", default="", help="to this model instead of the recorded one")
    s.add_argument(
        "--api-key", default=os.environ.get("TRAYLM_API_KEY", ""), help="(or TRAYLM_API_KEY)"
    )
    s.set_defaults(func=cmd_replay)


def _filters(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", default="", help="only requests for this model")
    s.add_argument("--status", default="", help="an HTTP code, ok or error")
    s.add_argument(
        "--client",
        default="",
        choices=("", *CLIENTS),
        help="local: this computer; lan: another one; box: a paired box; tuner: the tuner's "
        "measurements; bench: a benchmark run's requests; ollama: through the Ollama API",
    )
    s.add_argument("--text", default="", help="text in the request body or the reply")


def _filter_args(args: argparse.Namespace) -> dict[str, str]:
    return {"model": args.model, "status": args.status, "client": args.client, "text": args.text}


def _line(r: dict[str, Any]) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(r["arrived_s"]))
    tokens = f"{r['prompt_tokens'] or 0}→{r['completion_tokens'] or 0}"
    ttft = f"{r['ttft_s'] * 1000:.0f}ms" if r["ttft_s"] is not None else "-"
    cut = f" cut:{r['cut_by']}" if r["cut_by"] else ""
    # a GET or HEAD is recorded when it was refused (a wrong key on GET /v1/models)
    path = r["path"] if r.get("method", "POST") == "POST" else f"{r['method']} {r['path']}"
    rate = r.get("cache_hit_rate")
    if rate is not None:  # the conversation's share of prompt tokens from the prefix cache
        cut += f" cache {rate:.0%} of {r.get('conversation_requests', 1)}"
    run = f" {r['peer']}" if r["client"] in ("bench", "tuner") and r.get("peer") else ""
    return (
        f"{r['id']}  {when}  {r['status']:>3}  {path:<22} {r['model'][:28]:<28} "
        f"{r['engine_id'][:16]:<16} {tokens:>11} ttft {ttft:>6} {r['duration_s']:.2f}s "
        f"{r['client']}{run}{cut}"
    )


async def cmd_ls(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect() as client:
        rows = await client.requests_list(limit=args.limit, **_filter_args(args))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no recorded requests (requests.capture decides what is recorded)")
    for r in rows:
        print(_line(r))
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect() as client:
        detail = await client.request_detail(args.id)
        prompt = await client.request_prompt(args.id) if args.prompt else None
        names = (await client.settings())["settings"]["gateway"].get("api_key_names", {})
    if args.json:
        print(json.dumps({**detail, "prompt": prompt} if prompt else detail, indent=1))
        return 0
    print(_line(detail))
    who = detail["client"] + (f" {detail['peer']}" if detail["peer"] else "")
    key = detail["key"]
    named = f" ({names[key]})" if key in names else ""  # the app the key was made for
    print(f"client: {who}{f'  key {key}{named}' if key else ''}")
    print(f"engine: {detail['engine_id'] or '-'}  GPUs: {detail['gpus'] or '-'}")
    if detail["finish_reason"]:
        print(f"finish: {detail['finish_reason']}")
    if detail["error"]:
        print(f"error: {detail['error']}")
    print(f"capture: {detail['capture']}")
    if detail["request_body"]:
        print("--- request")
        print(detail["request_body"])
    reply = detail.get("reply") or {}
    if reply.get("reasoning"):
        print("--- reasoning")
        print(reply["reasoning"])
    if reply.get("text"):
        print("--- reply")
        print(reply["text"])
    for call in reply.get("tool_calls") or ():
        print("--- tool call")
        print(json.dumps(call))
    if prompt is not None:
        print(f"--- prompt as {prompt['engine_id']} templated it ({prompt['count']} tokens)")
        print(prompt["prompt"])
    return 0


async def cmd_tail(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect() as client:
        rows = await client.requests_list(limit=20, **_filter_args(args))
        for r in reversed(rows):
            print(_line(r), flush=True)
        after = max((r["order"] for r in rows), default=0)
        if not rows:
            latest = await client.requests_list(limit=1)
            after = latest[0]["order"] if latest else 0
        while args.follow:
            await asyncio.sleep(TAIL_POLL_S)
            new = await client.requests_list(after=after, limit=500, **_filter_args(args))
            for r in new:
                print(_line(r), flush=True)
            if new:
                after = new[-1]["order"]
            else:  # what the filters hide still moves the mark on
                newest = await client.requests_list(after=after, limit=500)
                after = newest[-1]["order"] if newest else after
    return 0


async def cmd_export(args: argparse.Namespace) -> int:
    """Into a temporary file next to FILE, renamed at the end: never a half-written FILE."""
    out = None if args.file == "-" else Path(args.file)
    tmp: Path | None = None
    sink: BinaryIO
    written = skipped = 0
    try:
        if out is not None:
            if out.is_dir():
                raise ConfigError(f"{out} is a folder; name a file, e.g. {out / 'requests.jsonl'}")
            fd, name = tempfile.mkstemp(dir=out.parent or ".", prefix=f".{out.name}.")
            tmp = Path(name)
            sink = os.fdopen(fd, "wb")
        else:
            sink = sys.stdout.buffer
        async with await DaemonClient.connect() as client:
            async for line in client.requests_export():
                if line.startswith(b'{"traylm_skipped"'):
                    skipped = int(json.loads(line)["traylm_skipped"])
                    continue
                sink.write(line)
                written += 1
        sink.flush()
        if out is not None and tmp is not None:
            sink.close()
            tmp.replace(out)
            tmp = None
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot write {args.file}: {exc.strerror}") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    where = f" to {out}" if out is not None else ""
    note = f"; {skipped} left out (no whole JSON body recorded)" if skipped else ""
    print(f"exported {written} requests{where}{note}", file=sys.stderr)
    return 0


async def cmd_replay(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(timeout_s=600) as client:
        result = await client.replay_request(args.id, model=args.model, api_key=args.api_key)
        rid = result["request_id"]
        print(f"replayed {args.id} as {rid or '(no id)'}: HTTP {result['status']}")
        detail = None
        for _ in range(20):  # the new request is written by the recorder within a second
            try:
                detail = await client.request_detail(rid)
                break
            except ControlAPIError as exc:
                if exc.http_status != 404 or not rid:
                    break
                await asyncio.sleep(0.25)  # not written yet
    reply = (detail or {}).get("reply") or {}
    if reply.get("text"):
        print(reply["text"])
    elif result["status"] >= 400 or not reply:
        print(result["body"][:4000])
    return 0 if result["status"] < 400 else 1

"""``traylm models search|info|fit|pull|add|ls|rm|verify|downloads|pause|resume|cancel|trust``.

Every command talks to the daemon (engines.client). ``pull`` shows a progress bar fed by the
daemon's download events; Ctrl-C pauses the download (``traylm models resume ID`` continues).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from engines.client import DaemonClient
from engines.client.follow import Followed, follow
from engines.core.sizes import human_bytes
from engines.events.codec import Event, to_plain
from engines.events.hub import (
    DownloadProgress,
    DownloadState,
    DownloadStateChanged,
    DownloadStatus,
    FitResult,
)
from engines.hub import folders_cli

TERMINAL = (DownloadState.READY, DownloadState.FAILED, DownloadState.CANCELLED)
BAR_WIDTH = 28
PAUSE_ANSWER_S = 20.0  # the daemon kills the worker at once and waits up to 10 s for it


def add_parsers(sub: Any) -> None:
    m = sub.add_parser("models", help="Hugging Face models: search, fit, download, library")
    msub = m.add_subparsers(title="models commands", metavar="ACTION", required=True)

    s = msub.add_parser("search", help="search text-generation models on the Hub")
    s.add_argument("query", nargs="?", default="", help="words in the model's name (default: any)")
    s.add_argument(
        "--sort",
        choices=("downloads", "likes", "recent"),
        default="downloads",
        help="order of the results (default downloads)",
    )
    s.add_argument("--quant", help="awq, gptq, fp8, compressed-tensors, bitsandbytes, nvfp4")
    s.add_argument("--limit", type=int, default=20, help="most results shown (20)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_search)

    s = msub.add_parser("info", help="a model's shape, size and files (no weights downloaded)")
    s.add_argument("repo_id", help="org/name on the Hugging Face Hub")
    s.add_argument("--revision", help="branch, tag or commit (default: main)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_info)

    s = msub.add_parser("fit", help="will it fit? weights, KV cache and a verdict per engine")
    s.add_argument("repo_id", help="org/name on the Hugging Face Hub")
    s.add_argument("--revision", help="branch, tag or commit (default: main)")
    s.add_argument(
        "--engine", choices=("vllm", "trtllm"), help="one engine's verdict (default: each)"
    )
    s.add_argument("--gpus", type=int, help="GPUs to use (default: 1 and 2)")
    s.add_argument("--context", type=int, help="context length (default: the model's)")
    s.add_argument("--concurrency", type=int, default=1, help="sequences at full length")
    s.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=("auto", "fp8"),
        help="KV cache element type: auto (the model's) or fp8 (half the memory)",
    )
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_fit)

    s = msub.add_parser("pull", help="download a model (verified against the Hub's hashes)")
    s.add_argument("repo_id", help="org/name on the Hugging Face Hub")
    s.add_argument("--revision", help="branch, tag or commit (default: main)")
    s.add_argument("--detach", action="store_true", help="queue it and return")
    s.set_defaults(func=cmd_pull)

    s = msub.add_parser("ls", aliases=["list"], help="models in the local Hugging Face cache")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_ls)

    s = msub.add_parser(
        "rm", aliases=["remove"], help="delete a model from the cache, or forget a model folder"
    )
    s.add_argument("repo_id", help="org/name (deleted from the cache) or a folder's name")
    s.add_argument("--revision", help="one revision only (default: all)")
    s.set_defaults(func=cmd_rm)

    s = msub.add_parser("verify", help="hash a cached model against the Hub's hashes")
    s.add_argument("repo_id", help="org/name of a downloaded model")
    s.add_argument("--revision", help="one revision only (default: each cached one)")
    s.set_defaults(func=cmd_verify)

    s = msub.add_parser("downloads", help="the download queue and history")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_downloads)

    for action in ("pause", "resume", "cancel"):
        s = msub.add_parser(action, help=f"{action} a download")
        s.add_argument("download_id", help="as `traylm models downloads` lists it")
        s.set_defaults(func=cmd_download_action, action=action)

    folders_cli.add_parsers(msub)

    s = msub.add_parser("trust", help="allow a model's own Python code (trust_remote_code)")
    s.add_argument("repo_id", help="org/name on the Hugging Face Hub")
    s.add_argument("--revoke", action="store_true", help="take the trust back")
    s.set_defaults(func=cmd_trust)


async def _client() -> DaemonClient:
    return await DaemonClient.connect(plain_calls=True)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    s = int(seconds)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


# --------------------------------------------------------------------------- hub commands


async def cmd_search(args: argparse.Namespace) -> int:
    async with await _client() as c:
        found = await c.search_models(
            args.query, sort=args.sort, quant=args.quant, limit=args.limit
        )
    if args.json:
        print(json.dumps(to_plain(found), indent=1))
        return 0
    if not found:
        print("no text-generation models match")
    for m in found:
        size = human_bytes(m.weights_bytes) if m.weights_bytes else "?"
        gated = " gated" if m.gated else ""
        quant = f" [{m.quantization}]" if m.quantization else ""
        print(f"{m.repo_id:<56} {size:>11} {m.downloads:>10,} dl {m.likes:>6,} likes{quant}{gated}")
    return 0


async def cmd_info(args: argparse.Namespace) -> int:
    async with await _client() as c:
        d = await c.model_details(args.repo_id, args.revision)
    if args.json:
        print(json.dumps(to_plain(d), indent=1))
        return 0
    params = "?"
    if d.parameters:
        params = (
            f"{d.parameters / 1e9:.2f} B" if d.parameters >= 1e9 else f"{d.parameters / 1e6:.1f} M"
        )
    print(f"{d.repo_id} @ {d.commit_sha[:12]} ({d.revision})")
    print(f"  architecture   {d.architecture or '?'} ({d.model_type or '?'})")
    print(f"  parameters     {params}  dtype {d.dtype}  quantization {d.quantization or 'none'}")
    print(
        f"  layers {d.num_layers}  hidden {d.hidden_size}  heads {d.num_attention_heads}  "
        f"kv heads {d.num_kv_heads}  head dim {d.head_dim}  vocab {d.vocab_size}"
    )
    print(f"  context        {d.max_context or '?'} tokens")
    print(f"  license        {d.license or '?'}{'  GATED (' + d.gated + ')' if d.gated else ''}")
    if d.needs_remote_code:
        print("  custom code    yes: it runs only after `traylm models trust " + d.repo_id + "`")
    print(f"  download       {human_bytes(d.download_bytes)} in {len(d.files)} files")
    for f in d.files:
        print(f"    {f.path:<48} {human_bytes(f.size_bytes):>11}  {f.kind}")
    for line in d.skipped_files:
        print(f"    skipped: {line}")
    return 0


async def cmd_fit(args: argparse.Namespace) -> int:
    async with await _client() as c:
        results = await c.model_fit(
            args.repo_id,
            revision=args.revision,
            engine=args.engine,
            gpus=args.gpus,
            context=args.context,
            concurrency=args.concurrency,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    if args.json:
        print(json.dumps(to_plain(results), indent=1))
        return 0
    for r in results:
        print(_fit_line(r))
    return 0


def _fit_line(r: FitResult) -> str:
    gpus = f"{len(r.gpus)}x {r.gpus[0].name.replace('NVIDIA GeForce ', '')}" if r.gpus else "cpu"
    badge = {"fits": "FITS", "tight": "TIGHT", "wont_fit": "WON'T FIT"}[r.verdict]
    lines = [
        f"{r.engine:<7} {gpus:<12} TP{r.tensor_parallel}  {badge:<9}  "
        f"weights {human_bytes(r.weights_bytes_per_gpu)}/GPU  KV {r.kv_tokens:,} tokens "
        f"({human_bytes(r.kv_bytes_per_token)}/token)  context {r.context_len:,}",
        f"        {r.reason}",
    ]
    lines += [f"        fix: {f.description} → {f.verdict}" for f in r.fixes]
    lines += [f"        note: {n}" for n in r.notes]
    p = r.placement
    if p is not None and p.fits:
        first = ", ".join(f"{e.action} {e.engine_id}" for e in p.evictions)
        lines.append(
            f"        now: would load on GPU {','.join(str(g) for g in p.gpus)}"
            + (f" after: {first}" if first else "")
        )
    elif p is not None:
        lines.append(f"        now: no room: {p.reason}")
    return "\n".join(lines)


async def cmd_pull(args: argparse.Namespace) -> int:
    async with await _client() as c:
        if args.detach:
            status = await c.pull(args.repo_id, args.revision)
            _say_queued(status, [])
            print(f"queued; `traylm models downloads` shows it, `traylm models pause {status.id}`")
            return 0
        bars: list[ProgressBar] = []
        final = await follow(
            c,
            followed(c, bars),
            lambda: c.pull(args.repo_id, args.revision),
            started=lambda status: _say_queued(status, bars),
        )
    print()
    print(f"{final.state}: {final.message}")
    if final.state == DownloadState.READY:
        print(f"snapshot: {final.snapshot_path}")
        return 0
    if final.state == DownloadState.PAUSED:
        print(f"resume with `traylm models resume {final.id}`")
    return 1


def _say_queued(status: DownloadStatus, bars: list[ProgressBar]) -> None:
    """Say what the download is; its bar, from now on, in ``bars``."""
    bars.append(ProgressBar(status))
    print(
        f"{status.repo_id} @ {status.commit_sha[:12]}: {status.files_total} files, "
        f"{human_bytes(status.total_bytes)} (download {status.id})"
    )


def followed(c: DaemonClient, bars: list[ProgressBar]) -> Followed[DownloadStatus, str]:
    """How `models pull` follows its download (engines/client/follow.py): the bar from events
    and from each status poll; Ctrl-C pauses it (what finished stays; `models resume` goes on),
    ``bars`` holds the bar once the download is known."""

    def show(event: Event, download_id: str) -> None:
        if isinstance(event, DownloadProgress) and event.download_id == download_id:
            bars[0].draw_progress(event)
        elif isinstance(event, DownloadStateChanged) and event.status.id == download_id:
            bars[0].draw_status(event.status)

    async def now(download_id: str) -> DownloadStatus:
        status = await c.download(download_id)
        bars[0].draw_status(status)
        return status

    return Followed(
        kinds=("download",),
        job_id=lambda status: status.id,
        line=lambda _e, _id: ("", False),
        ends=lambda e, download_id: (
            isinstance(e, DownloadStateChanged)
            and e.status.id == download_id
            and not _running(e.status)
        ),
        now=now,
        running=_running,
        cancel=lambda download_id: c.download_action(download_id, "pause"),
        stopping="pausing the download; `traylm models resume {id}` goes on from there",
        cancel_answer_s=PAUSE_ANSWER_S,
        poll_s=1.0,
        show=show,
    )


def _running(status: DownloadStatus) -> bool:
    return status.state not in TERMINAL and status.state != DownloadState.PAUSED


class ProgressBar:
    """One line, redrawn in place on a terminal; a line every 10 % otherwise."""

    def __init__(self, status: DownloadStatus) -> None:
        self.total = status.total_bytes
        self.tty = sys.stdout.isatty()
        self._last_decile = -1
        self._last_draw_s = 0.0

    def draw_status(self, s: DownloadStatus) -> None:
        if s.state in (DownloadState.RETRYING, DownloadState.FAILED) and s.message:
            self._line(f"{s.state}: {s.message}", force=True)
            return
        self._draw(s.done_bytes, s.rate_bytes_per_s, s.eta_s, s.current_file, str(s.state))

    def draw_progress(self, p: DownloadProgress) -> None:
        self._draw(p.done_bytes, p.rate_bytes_per_s, p.eta_s, p.current_file, "downloading")

    def _draw(self, done: int, rate: float, eta: float | None, file: str, state: str) -> None:
        frac = done / self.total if self.total else 1.0
        filled = int(frac * BAR_WIDTH)
        text = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {frac:6.1%} "
            f"{human_bytes(done)}/{human_bytes(self.total)} {human_bytes(rate)}/s "
            f"ETA {_duration(eta)} {state} {file[-40:]}"
        )
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw_s >= 0.1:
                self._last_draw_s = now
                sys.stdout.write("\r" + text[:150].ljust(150))
                sys.stdout.flush()
        elif int(frac * 10) > self._last_decile:
            self._last_decile = int(frac * 10)
            print(text, flush=True)

    def _line(self, text: str, *, force: bool = False) -> None:
        if self.tty:
            sys.stdout.write("\r" + " " * 150 + "\r")
        print(text, flush=True)


async def cmd_ls(args: argparse.Namespace) -> int:
    async with await _client() as c:
        models = await c.local_models()
        folders = await c.local_folders()
    if args.json:
        print(json.dumps(to_plain({"cache": models, "folders": folders}), indent=1))
        return 0
    folders_cli.print_folders(folders)
    if not models:
        print("no models in the Hugging Face cache; `traylm models pull org/name` downloads one")
    for m in models:
        refs = ",".join(m.refs) or "-"
        extra = []
        if m.profiles:
            extra.append(f"profiles {','.join(m.profiles)}")
        if m.served_by:
            extra.append(f"SERVED by {','.join(m.served_by)}")
        if m.engines:
            extra.append(f"engines {','.join(m.engines)}")
        print(
            f"{m.repo_id:<48} {m.commit_sha[:12]} {refs:<8} {human_bytes(m.size_bytes):>11} "
            f"{m.verified:<10} {'  '.join(extra)}"
        )
        for problem in m.problems:
            print(f"    {problem}")
    return 0


async def cmd_rm(args: argparse.Namespace) -> int:
    async with await _client() as c:
        if "/" not in args.repo_id:  # a registered folder's name (repo ids are org/name)
            await folders_cli.remove(c, args.repo_id)
            return 0
        data = await c.delete_model(args.repo_id, args.revision)
    print(f"deleted {data['repo_id']}: {human_bytes(int(data['freed_bytes']))} freed")
    return 0


async def cmd_verify(args: argparse.Namespace) -> int:
    async with await _client() as c:
        models = await c.verify_model(args.repo_id, args.revision)
    bad = 0
    for m in models:
        print(f"{m.repo_id} @ {m.commit_sha[:12]}: {m.verified}")
        for problem in m.problems:
            print(f"    {problem}")
        if m.verified != "verified":
            bad += 1
            print(f"    repair with `traylm models pull {m.repo_id} --revision {m.commit_sha}`")
    return 1 if bad else 0


async def cmd_downloads(args: argparse.Namespace) -> int:
    async with await _client() as c:
        found = await c.downloads()
    if args.json:
        print(json.dumps(to_plain(found), indent=1))
        return 0
    if not found:
        print("no downloads")
    for d in found:
        frac = d.done_bytes / d.total_bytes if d.total_bytes else 0.0
        print(
            f"{d.id}  {d.repo_id:<44} {d.state:<11} {frac:6.1%} of {human_bytes(d.total_bytes)}"
            f"  {d.message[:80]}"
        )
    return 0


async def cmd_download_action(args: argparse.Namespace) -> int:
    async with await _client() as c:
        status = await c.download_action(args.download_id, args.action)
    print(f"{status.id} {status.repo_id}: {status.state}")
    if status.state == DownloadState.PAUSED:
        print(status.resume_note)
    return 0


async def cmd_trust(args: argparse.Namespace) -> int:
    async with await _client() as c:
        data = await c.trust_model(args.repo_id, not args.revoke)
    if data["trust_remote_code"]:
        print(
            f"{args.repo_id}: its own Python code may now run in engines (trust_remote_code); "
            "revoke with --revoke"
        )
    else:
        print(f"{args.repo_id}: its code will not run")
    return 0

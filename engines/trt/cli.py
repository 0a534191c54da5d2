"""`traylm engines cache ls|rm|prune`.

The cache commands go through the daemon when it runs (it knows which engines serve from which
cache entry and refuses to remove those); without a daemon they work on the files directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from engines.client import DaemonClient
from engines.config.sections import Paths, load_settings
from engines.errors import ConfigError, DaemonUnavailable
from engines.events.codec import to_plain
from engines.events.trt import TRTCacheEntry
from engines.trt.cache import EngineCache

GIB = 1024**3


def add_engine_parsers(esub: Any) -> None:
    """Under `traylm engines`."""
    c = esub.add_parser("cache", help="built TensorRT-LLM engines (the engine cache)")
    csub = c.add_subparsers(title="cache commands", metavar="ACTION", required=True)
    s = csub.add_parser(
        "ls", aliases=["list"], help="list cached engines (least recently used first)"
    )
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_cache_ls)
    s = csub.add_parser("rm", aliases=["remove"], help="remove cached engines")
    s.add_argument("ids", nargs="+", metavar="ID", help="as `traylm engines cache ls` lists them")
    s.set_defaults(func=cmd_cache_rm)
    s = csub.add_parser("prune", help="remove stale engines and shrink the cache to its budget")
    s.add_argument(
        "--stale", action="store_true", help="also engines built for another TensorRT-LLM/GPU"
    )
    s.add_argument("--budget-gib", type=float, help="default: trt.cache_budget_gib")
    s.set_defaults(func=cmd_cache_prune)


# --------------------------------------------------------------------------- cache


async def _client() -> DaemonClient | None:
    try:
        return await DaemonClient.connect(plain_calls=True)
    except DaemonUnavailable:
        return None


def _local_cache() -> EngineCache:
    paths = Paths.from_env()
    budget = load_settings(paths.config_file).trt.cache_budget_gib
    return EngineCache(paths.trt_engines_dir, int(budget * GIB))


def _line(e: TRTCacheEntry) -> str:
    env = e.environment
    state = "in use by " + ", ".join(e.in_use_by) if e.in_use_by else ""
    if not e.compatible:
        state = f"STALE: {e.problem}"
    return (
        f"{e.id}  {e.size_bytes / GIB:7.2f} GiB  {e.model}  {e.quant_recipe} "
        f"tp{e.tensor_parallel_size}"
        f"  trtllm {env.get('tensorrt_llm', '?')} {env.get('gpu', '?')} "
        f"sm{env.get('compute_capability', '?').replace('.', '')}  used "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(e.last_used_s))}  {state}"
    ).rstrip()


async def cmd_cache_ls(args: argparse.Namespace) -> int:
    client = await _client()
    if client is not None:
        async with client:
            entries = await client.trt_cache()
    else:
        entries = await asyncio.to_thread(_local_cache().entries)
    if args.json:
        print(json.dumps(to_plain(entries), indent=1))
        return 0
    if not entries:
        print("no cached TensorRT engines (build-mode profiles add them when they start)")
    for e in entries:
        print(_line(e))
    if entries:
        total = sum(e.size_bytes for e in entries)
        print(f"{len(entries)} engine(s), {total / GIB:.2f} GiB")
    return 0


async def cmd_cache_rm(args: argparse.Namespace) -> int:
    client = await _client()
    try:
        for entry_id in args.ids:
            if client is not None:
                removed = await client.trt_cache_remove(entry_id)
            else:
                removed = await asyncio.to_thread(_local_cache().remove, entry_id, {})
            print(f"removed {removed.id} ({removed.size_bytes / GIB:.2f} GiB)")
    finally:
        if client is not None:
            await client.close()
    return 0


async def cmd_cache_prune(args: argparse.Namespace) -> int:
    client = await _client()
    if client is not None:
        async with client:
            removed = await client.trt_cache_prune(stale=args.stale, budget_gib=args.budget_gib)
    else:
        if args.stale:
            raise ConfigError(
                "--stale compares engines with the installed TensorRT-LLM and GPUs, which the "
                "daemon knows: start it (`traylm serve`) and run this again"
            )
        cache = _local_cache()
        budget = None if args.budget_gib is None else int(args.budget_gib * GIB)
        removed = await asyncio.to_thread(cache.prune, in_use={}, budget_bytes=budget)
    for e in removed:
        print(f"removed {e.id} ({e.size_bytes / GIB:.2f} GiB)")
    print(f"{len(removed)} engine(s) removed")
    return 0

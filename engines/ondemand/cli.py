"""`traylm ps`, `traylm load NAME`, `traylm unload NAME`, `traylm attach NAME URL`, `traylm
detach NAME`: models on demand from the command line (through the daemon's control API)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from engines.core.sizes import human_bytes
from engines.errors import ConfigError
from engines.events.codec import to_plain

if TYPE_CHECKING:
    from engines.client import DaemonClient
    from engines.events.models import LoadedModel, ServableModel

# `traylm ps` is a one-shot command: blocking calls without an event loop (OneShotClient); the
# others import the async client in their function (tests/engines/cli/test_cli_start.py).

LOAD_TIMEOUT_S = 900.0


def add_parsers(sub: Any) -> None:
    """Top-level commands."""
    s = sub.add_parser("ps", help="loaded models: GPUs, VRAM, requests, idle time, unload timer")
    s.add_argument("--all", action="store_true", help="every servable model, loaded or not")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_ps)
    s = sub.add_parser("load", help="load a model now (a profile, library model or repo id)")
    s.add_argument(
        "name", help="a profile, library model (org/name), model folder or attached server"
    )
    s.add_argument("--gpus", help="GPU indices: 0, 1 or 0,1 (default: the planner picks)")
    s.add_argument("--ttl", help="unload after this long idle: 300, 10m, 1h (0: never)")
    s.add_argument("--pin", action="store_true", help="never unload or evict it")
    s.add_argument(
        "--replicas",
        type=int,
        help="copies behind its one name, each its own engine (one per GPU when each fits "
        "one; default: the profile's replicas)",
    )
    s.add_argument("--no-wait", action="store_true", help="return once it is starting")
    s.add_argument("--timeout", type=float, default=LOAD_TIMEOUT_S, help="seconds to wait")
    s.set_defaults(func=cmd_load)
    s = sub.add_parser("unload", help="unload a model (after its running requests end)")
    s.add_argument("name", help="a loaded model (`traylm ps`)")
    s.set_defaults(func=cmd_unload)
    s = sub.add_parser(
        "attach", help="route NAME to an OpenAI-compatible server traylm did not start"
    )
    s.add_argument("name", help="the model name clients send for it")
    s.add_argument("url", help="its base URL, e.g. http://127.0.0.1:9000/v1 (loopback or LAN)")
    s.add_argument("--key-env", default="", help="environment variable holding its API key")
    s.set_defaults(func=cmd_attach)
    s = sub.add_parser("detach", help="stop routing to an attached server (it keeps running)")
    s.add_argument("name", help="the name it was attached as")
    s.set_defaults(func=cmd_detach)


async def _client() -> DaemonClient:
    from engines.client import DaemonClient

    return await DaemonClient.connect(plain_calls=True)


def cmd_ps(args: argparse.Namespace) -> int:
    from engines.client.oneshot import OneShotClient

    c = OneShotClient.connect()
    if args.all:
        models = c.servable_models()
        if args.json:
            print(json.dumps(to_plain(models), indent=1))
        else:
            _print_servable(models)
        return 0
    rows = c.loaded_models()
    if args.json:
        print(json.dumps(to_plain(rows), indent=1))
        return 0
    if not rows:
        print("no model is loaded; a request loads one (`traylm ps --all` lists them)")
        return 0
    print(f"{'NAME':<28} {'STATE':<9} {'GPUS':<5} {'MEMORY':>9} {'REQS':>6} {'IDLE':>7}  UNLOADS")
    for r in rows:
        print(_ps_line(r))
    return 0


def _ps_line(r: LoadedModel) -> str:
    gpus = ",".join(str(g) for g in r.gpus) or ("ext" if r.external else "cpu")
    held = r.vram_bytes or r.ram_bytes  # on the GPUs, or in host RAM for a model on the CPU
    vram = human_bytes(held) if held else "-"
    reqs = f"{r.in_flight}+{r.waiting}" if r.waiting else str(r.in_flight)
    idle = _duration(r.idle_for_s) if r.idle_for_s is not None else "-"
    if r.box:  # a paired box's: it loads and unloads there
        unloads = f"served by {r.box}"
    elif r.external:
        unloads = f"attached {r.url}"
    elif r.pinned:
        unloads = "pinned"
    elif r.unloads_in_s is not None:
        unloads = f"in {_duration(r.unloads_in_s)}"
    else:
        unloads = "never" if r.in_flight == 0 and r.waiting == 0 else "when idle"
    name = f"{r.name} @{r.box}" if r.box else r.name  # "chat @box-b"
    line = f"{name[:28]:<28} {r.state:<9} {gpus:<5} {vram:>9} {reqs:>6} {idle:>7}  {unloads}"
    line += f" ({r.origin})" if r.origin not in ("attached", "box") else ""
    line += f"  replica {r.replica}" if r.replica else ""
    shown = r.state == "starting" or r.box  # its start phase; a box's GPUs, or why it is away
    return line + (f"  {r.detail}" if shown and r.detail else "")


def _print_servable(models: list[ServableModel]) -> None:
    print(f"{'NAME':<36} {'KIND':<8} {'STATUS':<9} GPUS")
    for m in models:
        gpus = ",".join(str(g) for g in m.gpus) or "-"
        where = f"{gpus} (would go)" if m.gpus_planned else gpus
        why = f"  cannot start here: {m.blocked}" if m.blocked else ""
        print(f"{m.name[:36]:<36} {m.kind:<8} {m.status:<9} {where}{why}")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


async def cmd_load(args: argparse.Namespace) -> int:
    from engines.client.model_wait import load_and_wait

    gpus = None
    if args.gpus:
        try:
            gpus = [int(g) for g in args.gpus.split(",")]
        except ValueError:
            raise ConfigError(
                f"--gpus {args.gpus!r}: give GPU indices such as 0, 1 or 0,1"
            ) from None
    async with await _client() as c:
        await load_and_wait(
            c,
            args.name,
            timeout_s=args.timeout,
            gpus=gpus,
            ttl=args.ttl,
            pin=args.pin,
            wait=not args.no_wait,
            replicas=args.replicas,
        )
    return 0


async def cmd_unload(args: argparse.Namespace) -> int:
    async with await _client() as c:
        result = await c.unload_model(args.name)
    print(result["message"])
    return 0


async def cmd_attach(args: argparse.Namespace) -> int:
    key = os.environ.get(args.key_env, "") if args.key_env else ""
    async with await _client() as c:
        server = await c.attach(args.name, args.url, key_env=args.key_env, key=key)
    models = ", ".join(server.models) or "none listed"
    print(f"attached {server.name} → {server.url} (serves {models}); traylm never stops it")
    return 0


async def cmd_detach(args: argparse.Namespace) -> int:
    async with await _client() as c:
        server = await c.detach(args.name)
    print(f"detached {server.name} ({server.url} keeps running)")
    return 0

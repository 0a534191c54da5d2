"""`traylm pair [ADDRESS CODE]`, `traylm peers`, `traylm unpair NAME`: paired traylm boxes."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from engines.client import DaemonClient
from engines.errors import ConfigError
from engines.events.codec import to_plain
from engines.events.peers import PeerInfo

WAIT_POLL_S = 1.0


def add_parsers(sub: Any) -> None:
    """Top-level commands."""
    s = sub.add_parser(
        "pair",
        help="pair with another traylm box: without arguments, show a one-time code here; "
        "with ADDRESS CODE, pair with the box that shows CODE",
    )
    s.add_argument("address", nargs="?", help="the other box's address (HOST or HOST:PORT)")
    s.add_argument("code", nargs="?", help="the code `traylm pair` shows on the other box")
    s.add_argument(
        "--expires-in", type=float, metavar="S", help="seconds the code stays valid (1-3600)"
    )
    s.add_argument("--json", action="store_true", help="print the code as JSON and return at once")
    s.set_defaults(func=cmd_pair)
    s = sub.add_parser("peers", help="paired boxes: name, address, fingerprint, last seen")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_peers)
    s = sub.add_parser("unpair", help="remove a paired box (here, and there when it answers)")
    s.add_argument("name", help="the box's name (`traylm peers`)")
    s.set_defaults(func=cmd_unpair)


async def cmd_pair(args: argparse.Namespace) -> int:
    if args.address is not None and args.code is None:
        raise ConfigError(
            "give the code too: `traylm pair ADDRESS CODE` (the code `traylm pair` shows on "
            "the other box)"
        )
    async with await DaemonClient.connect(plain_calls=True) as client:
        if args.address is not None:
            peer = await client.join_peer(args.address, args.code)
            if args.json:
                print(json.dumps(to_plain(peer), indent=1))
            else:
                print(f"paired with {peer.name} at {peer.address}")
                print(f"  its fingerprint: {peer.fingerprint}")
            return 0
        code = await client.begin_pairing(args.expires_in)
        if args.json:
            print(json.dumps(to_plain(code), indent=1))
            return 0
        print(f"pairing code: {code.code}   (valid {code.expires_in_s:.0f} s, once)")
        print(f"on the other box: traylm pair {code.address} {code.code}")
        if len(code.addresses) > 1:
            print(f"  (this box's other addresses: {', '.join(code.addresses[1:])})")
        print(f"this box's fingerprint: {code.fingerprint}")
        print("waiting for the other box (Ctrl-C cancels)...", flush=True)
        try:
            return await _wait(client)
        except (KeyboardInterrupt, asyncio.CancelledError):
            await client.cancel_pairing()
            print("pairing cancelled")
            return 130


async def _wait(client: DaemonClient) -> int:
    while True:  # the CLI holds no event stream for this: a poll a second is enough
        state = await client.pairing()
        if not state.active:
            break
        await asyncio.sleep(WAIT_POLL_S)
    print(state.outcome or "the pairing ended")
    return 0 if state.outcome.startswith("paired with") else 1


async def cmd_peers(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as client:
        view = await client.peers()
    if args.json:
        print(json.dumps(to_plain(view), indent=1))
        return 0
    print(f"this box: {view.name}  fingerprint {view.fingerprint}")
    print(f"listening for paired boxes: {view.listening or 'no (none paired, no pairing on)'}")
    if not view.peers:
        print("no paired boxes; `traylm pair` shows a code to pair one")
        return 0
    for peer in view.peers:
        print(_line(peer))
        if peer.problem:
            print(f"    {peer.problem}")
    return 0


def _line(peer: PeerInfo) -> str:
    seen = (
        "never"
        if peer.last_seen_s is None
        else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(peer.last_seen_s))
    )
    state = {True: "reachable", False: "NOT REACHABLE", None: ""}[peer.reachable]
    return (
        f"{peer.name:<20} {peer.address:<24} {peer.fingerprint[:19]}...  last seen {seen}  {state}"
    )


async def cmd_unpair(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as client:
        result = await client.unpair(args.name)
    where = "here and there" if result.removed_there else f"here only ({result.detail})"
    print(f"unpaired {result.name}: removed {where}")
    return 0

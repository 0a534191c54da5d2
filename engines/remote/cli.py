"""`traylm remote status|set-key|clear-key`: the optional remote OpenAI-compatible fallback."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from typing import Any

from engines.client import DaemonClient
from engines.errors import ConfigError, DaemonUnavailable
from engines.events.codec import to_plain
from engines.remote.service import store_keyring


def add_parsers(sub: Any) -> None:
    """Top-level commands."""
    r = sub.add_parser("remote", help="the optional remote OpenAI-compatible fallback")
    rsub = r.add_subparsers(title="remote commands", metavar="ACTION", required=True)
    s = rsub.add_parser("status", help="whether the fallback is on, for which models, the key")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_remote_status)
    s = rsub.add_parser(
        "set-key", help="store the remote API key in the OS keyring (prompted, or from stdin)"
    )
    s.set_defaults(func=cmd_remote_set_key)
    s = rsub.add_parser("clear-key", help="delete the remote API key from the OS keyring")
    s.set_defaults(func=cmd_remote_clear_key)


async def _client() -> DaemonClient | None:
    try:
        return await DaemonClient.connect(plain_calls=True)
    except DaemonUnavailable:
        return None


async def cmd_remote_status(args: argparse.Namespace) -> int:
    client = await _client()
    if client is None:
        raise DaemonUnavailable(
            "the remote status comes from the daemon; start it with `traylm serve`"
        )
    async with client:
        status = await client.remote_status()
    if args.json:
        print(json.dumps(to_plain(status), indent=1))
        return 0
    print(f"remote fallback: {status.detail}")
    if status.base_url:
        print(f"  base URL: {status.base_url}")
    print(f"  requests routed remotely since the daemon started: {status.routed_requests}")
    return 0


async def cmd_remote_set_key(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        key = getpass.getpass("remote API key (not shown): ")
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        raise ConfigError("no key given; nothing stored")
    await asyncio.to_thread(store_keyring, key)
    print("stored the remote API key in the OS keyring (service traylm)")
    await _refresh()
    return 0


async def cmd_remote_clear_key(args: argparse.Namespace) -> int:
    await asyncio.to_thread(store_keyring, None)
    print("removed the remote API key from the OS keyring")
    await _refresh()
    return 0


async def _refresh() -> None:
    client = await _client()
    if client is not None:
        async with client:
            status = await client.remote_refresh_key()
        print(f"daemon: {status.detail}")

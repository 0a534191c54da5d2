"""``traylm models add PATH [--name NAME]``, and the folder part of ``models ls`` and ``rm``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engines.client import DaemonClient
from engines.events.hub import LocalFolder


def add_parsers(msub: Any) -> None:
    s = msub.add_parser(
        "add", help="register a model folder on this computer (then: traylm start NAME)"
    )
    s.add_argument("path", help="the folder with config.json, the weights and the tokenizer")
    s.add_argument("--name", help="the name to serve it by (default: the folder's name)")
    s.set_defaults(func=cmd_add)


async def cmd_add(args: argparse.Namespace) -> int:
    path = _absolute(args.path)
    async with await DaemonClient.connect() as c:
        folder = await c.add_local_folder(path, args.name)
    print(f"added {folder.name}: {folder.path}")
    print(f"  {folder.family or folder.architecture}, {_size(folder.size_bytes)} of weights")
    print(f"  serve it: `traylm start {folder.name} --wait`, then use model {folder.served_name!r}")
    return 0


async def remove(c: DaemonClient, name: str) -> None:
    folder = await c.remove_local_folder(name)
    print(f"removed {folder.name} from the library (the files stay in {folder.path})")


def print_folders(folders: list[LocalFolder]) -> None:
    if not folders:
        return
    print("model folders (`traylm start NAME` serves one):")
    for f in folders:
        state = "ok" if not f.problems else "CANNOT SERVE"
        print(f"  {f.name:<32} {_size(f.size_bytes):>11} {state:<12} {f.path}")
        for problem in f.problems:
            print(f"      {problem}")


def _absolute(path: str) -> str:
    """The daemon has no current folder: it gets the path as this shell means it."""
    return str(Path(path).expanduser().resolve())


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

"""``traylm models add PATH [--name NAME] [--tool-parser P] [--reasoning-parser R]``,
``traylm models set NAME KEY=VALUE ...`` (a registered folder's parsers; for a profile, a
preset or a downloaded model, through a profile), and the folder part of ``models ls`` and
``rm``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engines.client import DaemonClient
from engines.errors import ConfigError
from engines.events.hub import FOLDER_SETTINGS as SETTINGS
from engines.events.hub import LocalFolder
from engines.events.models import ServableModel

_PARSERS_HELP = (
    "vLLM's --tool-call-parser for it (llama3_json, hermes, mistral, ...; default: its "
    "family's, '' for off)"
)


def add_parsers(msub: Any) -> None:
    s = msub.add_parser(
        "add", help="register a model folder on this computer (then: traylm start NAME)"
    )
    s.add_argument("path", help="the folder with config.json, the weights and the tokenizer")
    s.add_argument("--name", help="the name to serve it by (default: the folder's name)")
    s.add_argument("--tool-parser", help=_PARSERS_HELP)
    s.add_argument(
        "--reasoning-parser",
        help="vLLM's --reasoning-parser for it (qwen3, deepseek_r1, ...; default: its "
        "family's, '' for off)",
    )
    s.set_defaults(func=cmd_add)

    s = msub.add_parser(
        "set",
        help="change a model's tool-call / reasoning parsers, e.g. tool_parser=hermes "
        "reasoning_parser= (a folder's own setting; a profile's, or a new profile for a "
        "downloaded model)",
    )
    s.add_argument("name", help="a model folder, profile or downloaded model (`traylm models ls`)")
    s.add_argument(
        "changes",
        nargs="+",
        metavar="KEY=VALUE",
        help="tool_parser=P and/or reasoning_parser=R (an empty value turns it off)",
    )
    s.set_defaults(func=cmd_set)


async def cmd_add(args: argparse.Namespace) -> int:
    path = _absolute(args.path)
    settings = {
        key: value
        for key, value in (
            ("tool_parser", args.tool_parser),
            ("reasoning_parser", args.reasoning_parser),
        )
        if value is not None
    }
    async with await DaemonClient.connect(plain_calls=True) as c:
        folder = await c.add_local_folder(path, args.name, settings)
    print(f"added {folder.name}: {folder.path}")
    print(f"  {folder.family or folder.architecture}, {_size(folder.size_bytes)} of weights")
    print(f"  {_parsers(folder)}")
    print(f"  serve it: `traylm start {folder.name} --wait`, then use model {folder.served_name!r}")
    return 0


async def cmd_set(args: argparse.Namespace) -> int:
    changes: dict[str, str] = {}
    for item in args.changes:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r}: write KEY=VALUE, e.g. tool_parser=hermes")
        changes[key.strip()] = value.strip()
    async with await DaemonClient.connect() as c:
        served = [m for m in await c.servable_models() if args.name in m.names]
        kinds = {m.kind for m in served}
        if "folder" not in kinds and kinds & {"library", "profile"}:
            return await _set_by_profile(c, args.name, served, changes)
        if "/" in args.name:
            raise ConfigError(
                f"{args.name!r} is neither a downloaded model nor a registered folder "
                "(`traylm models ls` lists both)"
            )
        folder = await c.change_local_folder(args.name, changes)
        loaded = any(r.engine_id == folder.name for r in await c.loaded_models())
    print(f"{folder.name}: {_parsers(folder)}")
    if loaded:
        print(
            f"  it runs with the old settings until it is unloaded: `traylm unload {folder.name}` "
            "(the next request loads it with the new ones)"
        )
    return 0


async def _set_by_profile(
    c: DaemonClient, name: str, served: list[ServableModel], changes: dict[str, str]
) -> int:
    """A profile's settings are changed in the profile (a preset's: in your own profile of
    its name, which replaces it). A downloaded model has no settings of its own: they go into a
    profile named as its engine, serving it by the same names (repo id, short name), which
    then replaces the library's entry; a second change edits that profile."""
    unknown = sorted(set(changes) - set(SETTINGS))
    if unknown:
        raise ConfigError(
            f"`traylm models set` has no setting {', '.join(map(repr, unknown))}; it takes "
            f"{' and '.join(SETTINGS)} (other settings: the profile, `traylm profiles`)"
        )
    entry = next(m for m in served if m.kind in ("profile", "library"))
    if entry.kind == "profile":
        fields = dict((await c.profile(entry.engine_id))["profile"])
        fields.pop("name", None)
    else:
        repo = entry.name
        fields = {
            "model": repo,
            "served_name": repo,
            "aliases": [repo.rsplit("/", 1)[-1]],
            "gpus": "auto",
            "description": f"library model {repo}, with settings of its own",
        }
    await c.save_profile(entry.engine_id, {**fields, **changes})
    tool = changes.get("tool_parser", fields.get("tool_parser", ""))
    print(
        f"{name}: profile {entry.engine_id!r} serves it now, tool calling: {tool or 'off'} "
        f"(`traylm profiles {entry.engine_id}` shows it)"
    )
    if any(r.engine_id == entry.engine_id for r in await c.loaded_models()):
        print(f"  loaded with the old settings until `traylm unload {entry.engine_id}`")
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
        print(f"      {_parsers(f)}")
        for problem in f.problems:
            print(f"      {problem}")


def _parsers(folder: LocalFolder) -> str:
    tool = f"tool calling: {folder.tool_parser}" if folder.tool_parser else "tool calling off"
    thinking = folder.reasoning_parser or "off"
    return f"{tool}, reasoning parser: {thinking}"


def _absolute(path: str) -> str:
    """The daemon has no current folder: it gets the path as this shell means it."""
    return str(Path(path).expanduser().resolve())


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

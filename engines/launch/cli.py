"""`traylm launch claude|codex|opencode [--model M] [-- ARGS...]`: the agent CLI run as a
child with this terminal (stdin, stdout, stderr inherited), pointed at traylm (agents.py),
with a model that can call tools loaded first and its own key (prepare.py). traylm's own lines
go to stderr; the client's output and exit status are its own (killed by a signal: 128 + N, as
a shell says it). Signals sent to traylm are passed on to the client; Ctrl-C reaches both from
the terminal, and traylm waits for the client to exit."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from types import FrameType
from typing import Any

from engines.config.paths import Paths
from engines.errors import TraylmError
from engines.launch.agents import AGENTS, Agent, Launch, launch

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "launch",
        help="run an agent CLI (Claude Code, Codex, opencode) pointed at traylm",
        description="Run an agent CLI against traylm: its own environment variables or config "
        "overrides (your config files are not touched), its own API key where keys are on, "
        "and a model that can call tools, loaded first. Arguments after -- go to the client.",
    )
    s.add_argument("agent", choices=sorted(AGENTS), help="which agent CLI")
    _add_options(s)
    s.add_argument("args", nargs=argparse.REMAINDER, help="-- then the client's own arguments")
    s.set_defaults(func=cmd_launch)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="",
        help="a model that can call tools (default: the loaded or last-used one that can)",
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds to wait for the model to load"
    )


def _split(args: argparse.Namespace) -> list[str]:
    """The client's arguments; traylm's options given after the agent's name (which argparse
    leaves among them) are read into ``args``."""
    words = list(args.args)
    cut = words.index("--") if "--" in words else len(words)
    ours = argparse.ArgumentParser(prog=f"traylm launch {args.agent}", add_help=False)
    _add_options(ours)
    found, unknown = ours.parse_known_args(words[:cut])
    if unknown:
        raise TraylmError(
            f"unknown option {unknown[0]!r}: give the client's own arguments after --, as in "
            f"`traylm launch {args.agent} -- {' '.join(unknown)}`"
        )
    for name in ("model", "timeout"):
        if getattr(found, name) != ours.get_default(name):
            setattr(args, name, getattr(found, name))
    return words[cut + 1 :]


def cmd_launch(args: argparse.Namespace) -> int:
    agent = AGENTS[args.agent]
    passed = _split(args)
    if shutil.which(agent.binary) is None:
        raise TraylmError(
            f"{agent.title} is not installed (no `{agent.binary}` on PATH): install it with "
            f"`{agent.install}`, then run `traylm launch {agent.name}` again"
        )
    import asyncio

    return _run_child(asyncio.run(_prepare(agent, args.model, args.timeout, passed)))


async def _prepare(agent: Agent, model: str, timeout_s: float, passed: list[str]) -> Launch:
    from engines.client import DaemonClient
    from engines.launch.prepare import agent_key, ready_model

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async with await DaemonClient.connect(plain_calls=True) as c:
        name = await ready_model(c, model, say=say, timeout_s=timeout_s)
        key = await agent_key(c, agent, Paths.from_env(), say)
        url = c.info.url
    say(f"{agent.title} → {url} with {name}")
    return launch(agent, url=url, key=key, model=name, args=passed, environ=os.environ)


def _run_child(run: Launch) -> int:
    """Run the client in the foreground and return its exit status. The handlers are in place
    before it starts, so a signal can never end traylm and leave the client behind."""
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum != signal.SIGINT and children:  # Ctrl-C: the terminal sent it to both
            children[0].send_signal(signum)

    before = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        children.append(subprocess.Popen(run.argv, env=run.env))
        code = children[0].wait()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code

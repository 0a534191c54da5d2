"""Launching an engine process from its adapter's LaunchSpec: the links and run files in place,
the environment it gets, and the process itself, leader of its own session (a process group the
supervisor ends whole) with its output on one pipe."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from engines.config.tomlfile import write_bytes_atomic
from engines.core.filemodes import keep_user_umask
from engines.runtime.adapters.base import RUN_DIR, LaunchSpec
from engines.runtime.output import strip_ansi


def make_link(link: Path, target: Path) -> None:
    """``link`` → ``target`` (both folders made), unless ``link`` exists already."""
    target.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink() and not link.exists():
        with contextlib.suppress(FileExistsError):  # another start made it meanwhile
            link.symlink_to(target, target_is_directory=True)


def write_run_files(spec: LaunchSpec, run_dir: Path) -> LaunchSpec:
    """Make the adapter's links; write its files into ``run_dir``, put that path into argv."""
    for link, target in spec.links.items():
        make_link(Path(link), Path(target))
    if not spec.files:
        return spec
    for name, text in spec.files.items():
        write_bytes_atomic(run_dir / name, text.encode(), mode=0o600)
    argv = tuple(a.replace(RUN_DIR, str(run_dir)) for a in spec.argv)
    return dataclasses.replace(spec, argv=argv)


def engine_env(spec: LaunchSpec) -> dict[str, str]:
    """The daemon's environment with the spec's variables, without traylm's PYTHONPATH."""
    env = {**os.environ, **spec.env}
    env.pop("PYTHONPATH", None)  # the engine's venv must not see traylm's packages
    return env


def argv_text(argv: Sequence[str]) -> str:
    """The command line as one log line (quoted, no ANSI codes or line breaks)."""
    return strip_ansi(shlex.join(argv)).replace("\r", " ").replace("\n", " ")


async def start_process(argv: Sequence[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session, stdout and stderr on one pipe. Raises OSError."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=keep_user_umask(),  # its caches (HF, compile) keep the user's modes
    )

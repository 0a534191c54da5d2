"""Run the real ``traylm`` command (``python -m engines``) from an async test: its exit status
and output. It never outlives the test: killed when it runs past its deadline."""

from __future__ import annotations

import asyncio
import os
import sys


async def traylm(*args: str, timeout_s: float = 120.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engines", *args, env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode()

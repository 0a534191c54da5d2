"""A real MCP server over stdio, written with the official SDK (``MCPServer``, FastMCP's name in
mcp 2), for the chat's MCP host tests. Only its tools are made up: ``add(a, b)``, and
``slow(seconds)`` that sleeps past a call's timeout.

    python tests/fakes/mcp_server.py [--env-file PATH] [--crash] [--http-port PORT]

``--env-file`` writes the server's environment and pid as JSON at start (the tests check that
no TRAYLM_* variable or key reached it, and that the process is gone after the chat closes);
``--crash`` exits with an error before speaking MCP (a server that fails to start);
``--http-port`` serves streamable HTTP instead of stdio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("traylm-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Wait this many seconds, then answer."""
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


def main() -> None:
    parser = argparse.ArgumentParser(description="a real MCP test server over stdio")
    parser.add_argument("--env-file", help="write the environment and pid here as JSON at start")
    parser.add_argument("--crash", action="store_true", help="exit 3 before speaking MCP")
    parser.add_argument(
        "--http-port", type=int, default=0, help="serve streamable HTTP on 127.0.0.1:PORT/mcp"
    )
    args = parser.parse_args()
    if args.env_file:
        info = {"pid": os.getpid(), "env": dict(os.environ)}
        Path(args.env_file).write_text(json.dumps(info))
    if args.crash:
        print("mcp test server: crashing at start on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    if args.http_port:
        server.run("streamable-http", host="127.0.0.1", port=args.http_port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()

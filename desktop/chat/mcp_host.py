"""The chat as an MCP host, with the official SDK (no Qt; everything here runs on the bridge's
asyncio loop).

Servers start on demand: the first chat sent with tools starts each configured server (stdio:
a child process; url: a streamable HTTP session), lists its tools and keeps the session open
until ``close()`` (the chat window closes, the app quits). A server that fails to start is
said in ``ToolsReady.failures`` and left out; the others serve. A call runs only when the chat
asks for it (after the user allowed it) and is bounded by ``call_timeout_s``; its failure comes
back as the tool's result text, for the model to read.

A stdio server's environment is exactly its config's ``env`` over the SDK's minimal set (PATH,
HOME, USER, LOGNAME, SHELL, TERM): nothing of traylm's (no TRAYLM_* variable, no API key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TextIO, cast

from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.streamable_http import streamable_http_client

from desktop.chat.mcp_config import MCPServerConfig

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0
RESULT_MAX_CHARS = 20_000  # what a tool's result may put into the conversation
TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")  # OpenAI's function names: [A-Za-z0-9_-]{1,64}


@dataclass(frozen=True)
class OfferedTool:
    name: str
    """Its name as the model sees it (the server's, or server_tool where two servers clash)."""
    server: str
    tool: str
    description: str
    schema_json: str

    def openai(self) -> dict[str, object]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": json.loads(self.schema_json),
            },
        }


@dataclass(frozen=True)
class ToolsReady:
    tools: tuple[OfferedTool, ...] = ()
    failures: tuple[str, ...] = ()
    """One line per server that did not start: its name and why."""

    def openai_json(self) -> str:
        """The request's ``tools`` (OpenAI's format), as JSON ("" when there are none)."""
        return json.dumps([t.openai() for t in self.tools]) if self.tools else ""


@dataclass(frozen=True)
class ToolResult:
    text: str
    failed: bool = False
    """The call did not give a result (the server's error, a timeout, a lost server): ``text``
    says why, and goes to the model like a result."""


@dataclass
class _Running:
    config: MCPServerConfig
    task: asyncio.Task[None]
    stop: asyncio.Event
    session: ClientSession | None = None
    tools: Sequence[types.Tool] = ()
    error: str = ""


@dataclass
class MCPHost:
    """One chat window's MCP servers. Use only on the bridge loop."""

    servers: tuple[MCPServerConfig, ...] = ()
    call_timeout_s: float = CALL_TIMEOUT_S
    start_timeout_s: float = START_TIMEOUT_S
    _running: dict[str, _Running] = field(default_factory=dict)
    _offered: dict[str, OfferedTool] = field(default_factory=dict)
    _ready: ToolsReady | None = None
    _starting: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def started(self) -> bool:
        return self._ready is not None

    async def ensure_started(self) -> ToolsReady:
        """Start every server not started yet (once; later calls return the same answer)."""
        async with self._starting:
            if self._ready is None:
                await asyncio.gather(*(self._start(s) for s in self.servers))
                self._ready = self._collect()
            return self._ready

    async def _start(self, config: MCPServerConfig) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        running = _Running(config, asyncio.create_task(self._serve(config, ready, stop)), stop)
        self._running[config.name] = running
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout_s)
        except TimeoutError:
            running.error = f"it did not answer within {self.start_timeout_s:g} s"
            stop.set()
        except _StartFailed as exc:
            running.error = str(exc)

    async def _serve(
        self, config: MCPServerConfig, ready: asyncio.Future[None], stop: asyncio.Event
    ) -> None:
        """The server's whole life in one task (the SDK's transports are entered and left in
        the same task): connect, initialize, list its tools, then wait for ``stop``."""
        running = self._running[config.name]
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    transport = _transport(config, cast(TextIO, errlog))
                    read, write = await stack.enter_async_context(transport)
                    session = await stack.enter_async_context(
                        ClientSession(read, write, read_timeout_seconds=self.start_timeout_s)
                    )
                    await session.initialize()
                    running.tools = (await session.list_tools()).tools
                    running.session = session
                    ready.set_result(None)
                    await stop.wait()
            except Exception as exc:  # boundary: a server is someone else's program
                why = _why(exc, errlog)
                log.info("MCP server %s: %s", config.name, why)
                if not ready.done():
                    ready.set_exception(_StartFailed(why))
                running.error = why
            finally:
                running.session = None

    def _collect(self) -> ToolsReady:
        tools: list[OfferedTool] = []
        failures: list[str] = []
        seen: set[str] = set()
        for running in self._running.values():
            name = running.config.name
            if running.session is None:
                failures.append(f"{name}: {running.error or 'it stopped'}")
                continue
            for tool in running.tools:
                offered = TOOL_NAME.sub("_", tool.name)[:64]
                if offered in seen:
                    offered = TOOL_NAME.sub("_", f"{name}_{tool.name}")[:64]
                seen.add(offered)
                schema = tool.input_schema or {"type": "object", "properties": {}}
                self._offered[offered] = OfferedTool(
                    offered, name, tool.name, tool.description or "", json.dumps(schema)
                )
                tools.append(self._offered[offered])
        return ToolsReady(tuple(tools), tuple(failures))

    def tool(self, name: str) -> OfferedTool | None:
        return self._offered.get(name)

    async def call(self, name: str, arguments_json: str) -> ToolResult:
        """Run tool ``name`` (as offered) with the model's arguments (JSON text)."""
        offered = self._offered.get(name)
        if offered is None:
            return ToolResult(f"there is no tool named {name!r}", failed=True)
        try:
            arguments = json.loads(arguments_json or "{}")
        except ValueError as exc:
            return ToolResult(f"the arguments are not valid JSON ({exc})", failed=True)
        if not isinstance(arguments, dict):
            return ToolResult("the arguments must be a JSON object", failed=True)
        running = self._running.get(offered.server)
        session = running.session if running else None
        if session is None:
            why = running.error if running and running.error else "it is not running"
            return ToolResult(f"the MCP server {offered.server} cannot run it: {why}", True)
        return await self._call(session, offered, arguments)

    async def _call(
        self, session: ClientSession, offered: OfferedTool, arguments: dict[str, Any]
    ) -> ToolResult:
        timeout_s = self.call_timeout_s
        late = f"{offered.name} did not answer within {timeout_s:g} s (the call timed out)"
        try:
            result = await asyncio.wait_for(
                session.call_tool(offered.tool, arguments, read_timeout_seconds=timeout_s),
                timeout_s + 5,
            )
        except TimeoutError:
            return ToolResult(late, failed=True)
        except Exception as exc:  # boundary: the server's failure becomes the tool's answer
            text = _message(exc)
            timed_out = "timed out" in text.lower() or "timeout" in text.lower()
            return ToolResult(late if timed_out else f"{offered.name} failed: {text}", True)
        if not isinstance(result, types.CallToolResult):
            return ToolResult(f"{offered.name} asked for input the chat cannot give", True)
        return ToolResult(_result_text(result)[:RESULT_MAX_CHARS], failed=result.is_error)

    async def close(self) -> None:
        """Stop every server (a stdio server's process is ended, and waited for)."""
        running, self._running = list(self._running.values()), {}
        self._offered.clear()
        self._ready = None
        for r in running:
            r.stop.set()
        if running:
            await asyncio.gather(*(r.task for r in running), return_exceptions=True)


class _StartFailed(Exception):
    pass


def _transport(
    config: MCPServerConfig, errlog: TextIO
) -> contextlib.AbstractAsyncContextManager[Any]:
    if config.url:
        return streamable_http_client(config.url)
    params = StdioServerParameters(
        command=config.command, args=list(config.args), env=dict(config.env)
    )
    return stdio_client(params, errlog=errlog)


def _why(exc: BaseException, errlog: IO[str]) -> str:
    """Why a server stopped: the error, and the last lines it wrote on stderr."""
    errlog.seek(0)
    tail = [line.strip() for line in errlog.read().splitlines() if line.strip()][-3:]
    said = f" (it said: {' / '.join(tail)[-300:]})" if tail else ""
    return f"{_message(exc)}{said}"


def _message(exc: BaseException) -> str:
    """The innermost message of an error (the SDK's task groups wrap them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"the command {exc.filename or ''} was not found; check its path in mcp.json"
    text = str(exc) or type(exc).__name__
    return text[:500]


def _result_text(result: types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts) or "(no output)"

"""A reply that calls tools, on the GUI thread: the MCP servers started on demand, each call
the model asks for shown and put to the user (Allow once / Always allow this tool / Deny), run
through the MCP session only once allowed, and its result sent back as a ``tool`` message so
the reply goes on; at most ``MAX_TOOL_ROUNDS`` rounds, then the model is asked without tools.

The host (desktop/chat/mcp_host.py) lives on the bridge loop and is reached only through
``Bridge.call_gateway``; what comes back is frozen values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from desktop.chat.mcp_config import load_servers
from desktop.chat.mcp_host import MCPHost, ToolResult, ToolsReady
from desktop.daemon.bridge import Bridge
from desktop.daemon.gateway import ChatStreamEnded, ToolCall
from desktop.daemon.messages import CallResult
from desktop.daemon.state import AppState
from engines.errors import ConfigError

MAX_TOOL_ROUNDS = 8
ALLOW_ONCE, ALWAYS, DENY = "once", "always", "deny"
DENIED = "The user denied this tool call; do not try it again, answer without it."


@dataclass(frozen=True)
class ToolRun:
    """One call of a reply, as shown and stored: its outcome is allowed, denied or failed."""

    call_id: str
    name: str
    server: str
    arguments: str
    outcome: str = ""  # "" while it waits for the user
    result: str = ""

    def stored(self) -> dict[str, str]:
        return {
            "name": self.name,
            "server": self.server,
            "arguments": self.arguments,
            "outcome": self.outcome,
            "result": self.result,
        }


class ToolLoop(QObject):
    asked = Signal(object)  # ToolRun waiting for the user's answer
    ran = Signal(object)  # ToolRun with its outcome and result
    noticed = Signal(str)  # a server that did not start, a model that cannot call tools

    def __init__(
        self,
        bridge: Bridge,
        state: AppState,
        *,
        call_timeout_s: float | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.state = state
        self.call_timeout_s = call_timeout_s
        self.host: MCPHost | None = None
        self.ready: ToolsReady | None = None
        self.always: set[str] = set()  # tools the user always allows (this window)
        self.turns: list[dict[str, object]] = []  # this reply's tool rounds (OpenAI messages)
        self.runs: list[ToolRun] = []
        self.rounds = 0
        self.waiting: ToolRun | None = None
        self._queue: list[ToolRun] = []
        self._then: Callable[[], None] | None = None
        self._told = False  # this reply said already that its model cannot call tools

    # ----------------------------------------------------------------- before a request

    def new_reply(self) -> None:
        self.turns, self.runs, self.rounds, self._told = [], [], 0, False
        self.waiting, self._queue, self._then = None, [], None

    def tools_json(self, model: str) -> str:
        """The tools to offer ``model`` in the next request ("" for none)."""
        if self.ready is None or not self.ready.tools or self.rounds >= MAX_TOOL_ROUNDS:
            return ""
        if self._blocked(model):
            self._tell_blocked(model)
            return ""
        return self.ready.openai_json()

    def _tell_blocked(self, model: str) -> None:
        if not self._told:
            self._told = True
            why = self._blocked(model) or f"{model} cannot call tools."
            self.noticed.emit(f"{why} Until then it is asked without the MCP servers' tools.")

    def turns_json(self) -> str:
        return json.dumps(self.turns) if self.turns else ""

    def _blocked(self, model: str) -> str:
        served = self.state.servable.get(model)
        return served.tools_blocked if served is not None else ""

    def prepare(self, model: str, then: Callable[[], None]) -> bool:
        """Start the servers the first time a chat is sent with tools (False: ``then`` runs
        once they are up; True: go on now)."""
        if self.host is not None or self.rounds:  # started (or starting) already
            return True
        try:
            servers = load_servers(self.bridge.paths)
        except ConfigError as exc:
            self.noticed.emit(f"The MCP servers are not used: {exc.message}")
            return True
        if not servers:
            return True
        if self._blocked(model):  # (the servers start once a model can use them)
            self._tell_blocked(model)
            return True
        host = self.host = MCPHost(servers)
        if self.call_timeout_s is not None:
            host.call_timeout_s = self.call_timeout_s

        async def start(_gateway: object) -> ToolsReady:
            return await host.ensure_started()

        self.bridge.call_gateway(start, lambda r: self._on_started(r, then))
        return False

    def _on_started(self, result: CallResult, then: Callable[[], None]) -> None:
        if isinstance(result.value, ToolsReady):
            self.ready = result.value
            for failure in result.value.failures:
                self.noticed.emit(f"An MCP server did not start, its tools are left out: {failure}")
        elif not result.cancelled:
            self.noticed.emit(f"The MCP servers did not start: {result.error}")
        then()

    # ----------------------------------------------------------------- after a reply

    def handle(self, ended: ChatStreamEnded, then: Callable[[], None]) -> bool:
        """The reply asks for tool calls: put each to the user, run the allowed ones, then
        ``then`` asks the model again (False: nothing to do, the reply is over)."""
        if not ended.tool_calls or ended.error is not None or self.host is None:
            return False
        self.rounds += 1
        self.turns.append(
            {
                "role": "assistant",
                "content": ended.content or None,
                "tool_calls": [call.openai() for call in ended.tool_calls],
            }
        )
        self._queue = [self._run_of(call) for call in ended.tool_calls]
        self._then = then
        self._next()
        return True

    def _run_of(self, call: ToolCall) -> ToolRun:
        offered = self.host.tool(call.name) if self.host else None
        server = offered.server if offered else ""
        return ToolRun(call.call_id, call.name, server, call.arguments)

    def _next(self) -> None:
        if not self._queue:
            then, self._then = self._then, None
            if then is not None:
                then()
            return
        run = self._queue.pop(0)
        if run.name in self.always:
            self._execute(run)
        else:
            self.waiting = run
            self.asked.emit(run)

    def answer(self, call_id: str, decision: str) -> None:
        """The user's answer to the call waiting: ALLOW_ONCE, ALWAYS or DENY."""
        run = self.waiting
        if run is None or run.call_id != call_id:
            return
        self.waiting = None
        if decision == DENY:
            self._finish(run, ToolResult(DENIED, failed=True), "denied")
            return
        if decision == ALWAYS:
            self.always.add(run.name)
        self._execute(run)

    def _execute(self, run: ToolRun) -> None:
        host = self.host
        assert host is not None

        async def call(_gateway: object) -> ToolResult:
            return await host.call(run.name, run.arguments)

        def done(result: CallResult) -> None:
            if self._then is None:  # stopped meanwhile
                return
            value = result.value
            if not isinstance(value, ToolResult):
                value = ToolResult(f"the call did not run: {result.error}", failed=True)
            self._finish(run, value, "failed" if value.failed else "allowed")

        self.bridge.call_gateway(call, done)

    def _finish(self, run: ToolRun, result: ToolResult, outcome: str) -> None:
        finished = ToolRun(run.call_id, run.name, run.server, run.arguments, outcome, result.text)
        self.runs.append(finished)
        self.turns.append({"role": "tool", "tool_call_id": run.call_id, "content": result.text})
        self.ran.emit(finished)
        self._next()

    @property
    def busy(self) -> bool:
        """The reply waits for the user's answer or a tool's result."""
        return self._then is not None

    def stop(self) -> bool:
        """Stop the reply while it waits for the user or a tool (True: it was)."""
        busy = self._then is not None
        self.waiting, self._queue, self._then = None, [], None
        return busy

    # ----------------------------------------------------------------- closing

    def close(self, *, wait_s: float = 0.0) -> None:
        """Stop the servers (the chat window closed); with ``wait_s`` wait until they are
        (the app quits: no server process may be left behind)."""
        host, self.host, self.ready = self.host, None, None
        self.stop()
        if host is None:
            return

        async def close(_gateway: object) -> None:
            await host.close()

        if wait_s > 0:
            self.bridge.wait_gateway(close, wait_s)
        else:
            self.bridge.call_gateway(close)

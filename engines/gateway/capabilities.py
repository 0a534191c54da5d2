"""What a running engine can serve, and the errors that say so before a request is forwarded.

An engine's capabilities come from what it was started with: its version's recorded route list
(per model task, resources/routes/ or probed at install), the task its model runs (the profile's
runner and the model's config.json architectures), its tool-call parser, and whether it keeps
Responses. A request the engine cannot serve gets a message naming the profile setting to
change; when the gateway could not tell in advance (no route list, no config.json), the engine's
own terse error (``404 {"detail": "Not Found"}``, vLLM's tool-choice error) is explained instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engines.adapters.routeset import RouteSet
from engines.adapters.vllm_models import family_parsers, model_tasks
from engines.gateway.shapes import api_error, error_message, is_anthropic
from engines.modelinfo import read_model_info
from engines.supervisor import ManagedEngine

RESPONSES_STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"

_KIND = {
    "generate": "a text-generation model",
    "embed": "an embedding model",
    "classify": "a classification (reranker) model",
    "transcription": "a speech-to-text model",
}
_FIX = {
    "generate": 'serve a chat model in another profile (or set runner = "generate" in profile '
    "{profile!r} if this model can generate text)",
    "embed": 'serve an embedding model in its own profile with runner = "pooling" (for '
    'example model = "BAAI/bge-small-en-v1.5") and send the request to its served name',
    "classify": 'serve a reranker in its own profile with runner = "pooling" (for example '
    'model = "BAAI/bge-reranker-base") and send the request to its served name',
    "transcription": "serve a speech-to-text model in its own profile (for example model = "
    '"openai/whisper-large-v3-turbo") and send the audio to its served name',
}
_PREFERRED = ("generate", "embed", "classify", "transcription")
# A route served by several kinds of model is suggested with the one it is meant for: rerank
# and score take embedding models too, but a reranker (classification model) is what users want.
_SUGGESTED = ("generate", "classify", "embed", "transcription")


@dataclass(frozen=True)
class Capabilities:
    engine_id: str
    profile: str
    label: str
    """Engine and version as users install it, e.g. "vllm 0.32.0"."""
    routes: RouteSet | None
    tasks: frozenset[str] | None
    """The vLLM task the model runs; None when unknown (no config.json, or not vLLM)."""
    architectures: tuple[str, ...]
    tool_parser: str
    suggested_tool_parser: str
    checks_tools: bool
    stores_responses: bool

    @functools.cached_property
    def servable(self) -> frozenset[str]:
        """The "METHOD /route" keys this engine serves for its model's task (for any task when
        the task is unknown), worked out once: every request asks."""
        if self.routes is None:
            return frozenset()
        tasks = self.routes.tasks.keys() if self.tasks is None else self.tasks
        return frozenset().union(*(self.routes.tasks.get(task, ()) for task in tasks))


def describe(engine: ManagedEngine) -> Capabilities:
    """Blocking (reads the model's config.json): run it in a thread."""
    profile = engine.profile
    vllm = profile.engine == "vllm"
    info = read_model_info(engine.model, profile.revision) if vllm else None
    tasks = None
    if info is not None:
        tasks = model_tasks(
            profile, info.architectures, sentence_transformers=info.sentence_transformers
        )
    store = profile.env.get(RESPONSES_STORE_ENV, "").lower() in ("1", "true")
    return Capabilities(
        engine_id=engine.engine_id,
        profile=profile.name,
        label=f"{engine.runtime.engine} {engine.runtime.version}",
        routes=engine.runtime.routes,
        tasks=tasks,
        architectures=info.architectures if info else (),
        tool_parser=profile.tool_parser,
        suggested_tool_parser=family_parsers(engine.model, info.config if info else None).tool,
        checks_tools=vllm,
        stores_responses=store,
    )


class CapabilityCache:
    """Capabilities per engine, worked out once per start of that engine."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[float | None, Capabilities]] = {}

    async def of(self, engine: ManagedEngine) -> Capabilities:
        hit = self.known(engine)
        if hit is not None:
            return hit
        caps = await asyncio.to_thread(describe, engine)
        self._known[engine.engine_id] = (engine.started_at_s, caps)
        return caps

    def known(self, engine: ManagedEngine) -> Capabilities | None:
        """The capabilities of this start of ``engine`` if they were worked out already."""
        hit = self._known.get(engine.engine_id)
        return hit[1] if hit is not None and hit[0] == engine.started_at_s else None


def serve_problem(
    caps: Capabilities,
    method: str,
    route: str,
    path: str,
    payload: Mapping[str, Any],
    model: str,
) -> web.Response | None:
    """The error for a request this engine cannot serve (the route, or tools without a
    parser), or None."""
    found = route_problem(caps, method, route, path, model)
    if found is not None:
        return found
    why = tools_problem(caps, path, payload, model)
    if why:
        return api_error(path, 400, why, param="tools", code="tool_parser_missing")
    return None


def route_problem(
    caps: Capabilities, method: str, route: str, path: str, model: str
) -> web.Response | None:
    """404 when the engine's version has no such route at all; 400 when it has it, but not for
    the kind of model this engine runs."""
    if caps.routes is None or f"{method} {route}" in caps.servable:
        return None
    if not caps.routes.serves(method, route):
        return api_error(
            path,
            404,
            f"{caps.label} (engine {caps.engine_id!r}, serving {model!r}) does not serve "
            f"{method} {route}; a newer engine version may: `traylm engines install "
            f"{caps.label.split()[0]} --version NEWER`",
            type_="not_found",
            code="route_not_served",
        )
    if caps.tasks is None or caps.routes.serves(method, route, caps.tasks):
        return None
    return api_error(path, 400, task_message(caps, route, model), code="model_cannot_serve_route")


def task_message(caps: Capabilities, route: str, model: str) -> str:
    assert caps.routes is not None and caps.tasks is not None
    task = next((t for t in _PREFERRED if t in caps.tasks), "")
    kind = _KIND.get(task, f"a {'/'.join(sorted(caps.tasks))} model")
    arch = f" ({', '.join(caps.architectures)})" if caps.architectures else ""
    serving = caps.routes.tasks_serving("POST", route) or caps.routes.tasks_serving("GET", route)
    needed = next((t for t in _SUGGESTED if t in serving), "")
    wants = f": that needs {_KIND[needed]}" if needed else ""
    fix = _FIX.get(needed, "serve a model that supports it in another profile")
    return (
        f"{model!r} is {kind}{arch} in engine {caps.engine_id!r}, so it cannot serve "
        f"{route}{wants}. To fix: {fix.format(profile=caps.profile)}."
    )


def tools_problem(caps: Capabilities, path: str, payload: Mapping[str, Any], model: str) -> str:
    """Why a request with tools cannot be served ("" when it can): vLLM needs a tool-call
    parser for any tool choice but "none"."""
    if not caps.checks_tools or caps.tool_parser or not _asks_for_tools(path, payload):
        return ""
    return tools_message(caps, model)


def tools_message(caps: Capabilities, model: str) -> str:
    suggest = caps.suggested_tool_parser
    which = (
        f'tool_parser = "{suggest}"'
        if suggest
        else "tool_parser (llama3_json for Llama 3.x, hermes for Qwen, mistral for Mistral)"
    )
    return (
        f"{model!r} cannot call tools: engine {caps.engine_id!r} was started without a tool "
        f"calling format. Set {which} in profile {caps.profile!r} (the dashboard calls it "
        f'"Tool calling format"), then stop and start the engine: `traylm stop '
        f"{caps.engine_id}` and `traylm start {caps.profile}`."
    )


def _asks_for_tools(path: str, payload: Mapping[str, Any]) -> bool:
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools:
        return False
    choice = payload.get("tool_choice")
    if is_anthropic(path):
        return not (isinstance(choice, Mapping) and choice.get("type") == "none")
    if choice == "none":
        return False
    # the Responses API also takes built-in tools (web search, MCP) that need no parser
    return any(isinstance(t, Mapping) and t.get("type", "function") == "function" for t in tools)


def explain_engine_error(
    caps: Capabilities | None, resp: web.Response, *, method: str, route: str, path: str, model: str
) -> web.Response:
    """The engine's own terse errors, explained: FastAPI's bare 404 for a route the model's
    task does not mount, vLLM's tool-choice error, and an unknown stored response."""
    if caps is None or not isinstance(resp.body, bytes):
        return resp
    message = error_message(resp.body) or ""
    if resp.status == 404 and message == "Not Found":
        text = (
            f"{caps.label} (engine {caps.engine_id!r}) does not serve {method} {route} for "
            f"{model!r}: the engine mounts routes by the kind of model it runs"
        )
        if caps.routes is not None and caps.tasks is not None:
            text = task_message(caps, route, model)
        return api_error(path, 404, text, type_="not_found", code="route_not_served")
    if resp.status == 400 and "requires" in message and "--tool-call-parser" in message:
        return api_error(path, 400, tools_message(caps, model), code="tool_parser_missing")
    if resp.status == 404 and message.startswith("Response with id") and not caps.stores_responses:
        return api_error(
            path,
            404,
            f"{message} Engine {caps.engine_id!r} does not keep responses: set "
            f'env = {{ {RESPONSES_STORE_ENV} = "1" }} in profile {caps.profile!r} to keep them '
            "(vLLM then holds every response in memory until the engine stops).",
            param="response_id",
            code="response_not_found",
        )
    return resp

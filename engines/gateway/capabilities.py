"""What a running engine can serve, and the errors that say so before a request is forwarded.

An engine's capabilities come from what it was started with: its version's recorded route list
(per model task, resources/routes/ or probed at install), the task its model runs (the profile's
runner and the model's config.json architectures), its tool-call parser, and whether it keeps
Responses. A request the engine cannot serve gets a message naming the setting to change where
it lives (a profile, a preset, a registered model folder, a downloaded model: ``served_as``);
when the gateway could not tell in advance (no route list, no config.json), the engine's own
terse error (``404 {"detail": "Not Found"}``, vLLM's tool-choice error) is explained instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engines.config.profiles import Profile
from engines.core.modelinfo import read_model_info
from engines.errors import quoted
from engines.gateway.shapes import api_error, error_message, is_anthropic
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.adapters.routeset import RouteSet
from engines.runtime.adapters.vllm_models import family_parsers, model_tasks
from engines.runtime.supervisor import ManagedEngine

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
    served_name: str = ""
    """The profile's served name (a downloaded model's: its repo id)."""
    served_as: str = "profile"
    """What the engine serves, as the catalog has it (``ServedAs``): where its settings live."""

    @functools.cached_property
    def servable(self) -> frozenset[str]:
        """The "METHOD /route" keys this engine serves for its model's task (for any task when
        the task is unknown), worked out once: every request asks."""
        if self.routes is None:
            return frozenset()
        tasks = self.routes.tasks.keys() if self.tasks is None else self.tasks
        return frozenset().union(*(self.routes.tasks.get(task, ()) for task in tasks))


ServedAs = Callable[[str], str]
"""engine id → "profile", "preset", "folder" (``traylm models add``), "library" (a downloaded
model run without a profile), "attached", or "" (an engine started with --model); blocking."""


def describe(engine: ManagedEngine, served_as: ServedAs = lambda _id: "profile") -> Capabilities:
    """Blocking (reads the model's config.json): run it in a thread."""
    runtime = engine.runtime
    label = f"{runtime.engine} {runtime.version}"
    return _described(engine.profile, engine.engine_id, engine.model, label, runtime, served_as)


def planned(profile: Profile, served_as: ServedAs) -> Capabilities:
    """What an engine started from ``profile`` will serve, as far as the profile and the
    model's config.json tell before it runs (no route list yet). Blocking, like ``describe``."""
    return _described(profile, profile.name, profile.model, profile.engine, None, served_as)


def _described(
    profile: Profile,
    engine_id: str,
    model: str,
    label: str,
    runtime: EngineRuntime | None,
    served_as: ServedAs,
) -> Capabilities:
    vllm = profile.engine == "vllm"
    info = read_model_info(model, profile.revision) if vllm else None
    tasks = None
    if info is not None:
        tasks = model_tasks(
            profile, info.architectures, sentence_transformers=info.sentence_transformers
        )
    store = profile.env.get(RESPONSES_STORE_ENV, "").lower() in ("1", "true")
    return Capabilities(
        engine_id=engine_id,
        profile=profile.name,
        label=label,
        routes=runtime.routes if runtime is not None else None,
        tasks=tasks,
        architectures=info.architectures if info else (),
        tool_parser=profile.tool_parser,
        suggested_tool_parser=family_parsers(model, info.config if info else None).tool,
        checks_tools=vllm,
        stores_responses=store,
        served_name=profile.effective_served_name,
        served_as=served_as(engine_id),
    )


class CapabilityCache:
    """Capabilities per engine, worked out once per start of that engine."""

    def __init__(self, served_as: ServedAs = lambda _id: "profile") -> None:
        self._served_as = served_as
        self._known: dict[str, tuple[float | None, Capabilities]] = {}

    async def of(self, engine: ManagedEngine) -> Capabilities:
        hit = self.known(engine)
        if hit is not None:
            return hit
        caps = await asyncio.to_thread(describe, engine, self._served_as)
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
            f"{caps.label} (engine {caps.engine_id!r}, serving {quoted(model)}) does not serve "
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
        f"{quoted(model)} is {kind}{arch} in engine {caps.engine_id!r}, so it cannot serve "
        f"{route}{wants}. To fix: {fix.format(profile=caps.profile)}."
    )


def tools_problem(caps: Capabilities, path: str, payload: Mapping[str, Any], model: str) -> str:
    """Why a request with tools cannot be served ("" when it can): vLLM needs a tool-call
    parser for any tool choice but "none"."""
    if not caps.checks_tools or caps.tool_parser or not asks_for_tools(path, payload):
        return ""
    return tools_message(caps, model)


def tools_message(caps: Capabilities, model: str) -> str:
    """Why ``model`` cannot call tools, and the change that fixes it where this engine's
    settings live (a profile, a preset, a registered folder, a downloaded model)."""
    suggest = caps.suggested_tool_parser
    name = caps.profile
    parser = suggest or "FORMAT"
    which = (
        ""
        if suggest
        else " (FORMAT: llama3_json for Llama 3.x, hermes for Qwen, mistral for Mistral)"
    )
    said = (
        f"{quoted(model)} cannot call tools: engine {caps.engine_id!r} has no tool calling "
        "format set. "
    )
    if caps.served_as == "folder":
        return said + (
            f"Set one for the model folder: `traylm models set {name} tool_parser={parser}`"
            f"{which}; loaded already, it keeps its old setting until `traylm unload {name}` "
            "(the next request loads it with the new one)."
        )
    if caps.served_as == "library":
        return said + (
            f"Set one for it: `traylm models set {caps.served_name} tool_parser={parser}`"
            f"{which} (a profile {name!r} then serves it with that setting); loaded already, "
            f"it keeps its old setting until `traylm unload {name}`."
        )
    restart = (
        f"then stop and start the engine: `traylm stop {caps.engine_id}` and `traylm start {name}`."
    )
    command = f"`traylm models set {name} tool_parser={parser}`"
    if caps.served_as == "preset":
        return said + (
            f"Profile {name!r} is a shipped preset (read-only): save your own profile named "
            f'{name!r} with tool_parser = "{parser}"{which}, which replaces it ({command} '
            f'does; so does the dashboard\'s "Tool calling format"), {restart}'
        )
    if caps.served_as == "":
        return said + (
            f"It was started from a model, not a profile: start it again from a profile "
            f'with tool_parser = "{parser}"{which}, or register its folder with '
            f"`traylm models add PATH --tool-parser {parser}`."
        )
    return said + (
        f'Set tool_parser = "{parser}"{which} in profile {name!r} ({command} does; the '
        f'dashboard calls it "Tool calling format"), {restart}'
    )


def asks_for_tools(path: str, payload: Mapping[str, Any]) -> bool:
    """A request whose tools need a tool-call parser (any tool choice but "none")."""
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
            f"{quoted(model)}: the engine mounts routes by the kind of model it runs"
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
            f"{message} Engine {caps.engine_id!r} does not keep responses, nor does "
            "traylm now: `traylm config set requests.responses_keep 10000` has traylm keep "
            f'them (bounded, on disk), or set env = {{ {RESPONSES_STORE_ENV} = "1" }} '
            f"{_where_settings(caps)} (vLLM then holds every response in memory until it "
            "stops).",
            param="response_id",
            code="response_not_found",
        )
    return resp


_SERVED_AS_WORDS = {
    "preset": "a shipped preset",
    "folder": "a registered model folder",
    "library": "a downloaded model",
    "": "started from a model",
}


def _where_settings(caps: Capabilities) -> str:
    """Where a setting of this engine goes: its own profile, or a profile saved for its name
    when it runs from a preset, a folder or a downloaded model."""
    if caps.served_as == "profile":
        return f"in profile {caps.profile!r}"
    kind = _SERVED_AS_WORDS.get(caps.served_as, caps.served_as)
    return f"in a profile of your own serving {caps.served_name!r} (it is {kind} now)"

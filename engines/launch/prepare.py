"""What `traylm launch` asks the daemon before the agent runs: the model (one that can call
tools, loaded first, its progress said) and the agent's own API key where keys are on.

The key is made once per agent and named after it (``gateway.api_key_names``); the daemon
keeps only its digest, so the key itself is kept for the next launch in the state dir (mode
0600), and made again when it is no longer accepted (removed with `traylm keys remove`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from pathlib import Path

from engines.client import DaemonClient
from engines.client.model_wait import load_and_wait
from engines.config.paths import Paths
from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError
from engines.events.models import ModelStatus, ServableModel
from engines.launch.agents import NO_KEY, Agent

LOAD_TIMEOUT_S = 900.0
RECENT_REQUESTS = 200
"""How far back the recorder is read for the last model used."""


async def ready_model(
    c: DaemonClient, wanted: str, *, say: Callable[[str], None], timeout_s: float = LOAD_TIMEOUT_S
) -> str:
    """The name of a model that can call tools, loaded: ``wanted``, or without it the loaded
    or last-used one that can. ConfigError saying what to do when there is none."""
    models = await c.servable_models()
    chosen = _named(models, wanted) if wanted else await _default(c, models)
    if chosen.tools_blocked:
        raise ConfigError(f"an agent needs a model that can call tools. {chosen.tools_blocked}")
    if chosen.blocked:
        raise ConfigError(f"{chosen.name!r} cannot start here: {chosen.blocked}")
    if chosen.status != ModelStatus.LOADED:
        await load_and_wait(c, chosen.name, timeout_s=timeout_s, say=say)
    return chosen.name


def _named(models: list[ServableModel], wanted: str) -> ServableModel:
    for m in models:
        if wanted in (m.name, *m.aliases, *m.names):
            return m
    raise ConfigError(f"the model {wanted!r} is not served; `traylm ps --all` lists the models")


async def _default(c: DaemonClient, models: list[ServableModel]) -> ServableModel:
    able = [m for m in models if not m.tools_blocked and not m.blocked]
    loaded = {r.name: r.idle_for_s or 0.0 for r in await c.loaded_models()}
    in_use = sorted((m for m in able if m.name in loaded), key=lambda m: loaded[m.name])
    if in_use:
        return in_use[0]
    for row in await c.requests_list(limit=RECENT_REQUESTS):
        used = next((m for m in able if row.get("model") in (m.name, *m.names)), None)
        if used is not None:
            return used
    if able:
        names = ", ".join(m.name for m in able[:8])
        raise ConfigError(
            f"no model that can call tools is loaded or used lately: name one with --model "
            f"({names})"
        )
    raise ConfigError(
        "no model here can call tools: give one a tool calling format (`traylm models set "
        "NAME tool_parser=hermes` for Qwen, llama3_json for Llama 3.x), then launch with "
        "--model NAME"
    )


async def agent_key(c: DaemonClient, agent: Agent, paths: Paths, say: Callable[[str], None]) -> str:
    """The key ``agent`` sends: its own, where loopback clients need one; else a stand-in."""
    gateway = (await c.settings())["settings"]["gateway"]
    digests = list(gateway["api_key_sha256"])
    if not digests or gateway.get("keys_for", "all") != "all":
        return NO_KEY
    kept = _key_file(paths, agent)
    key = kept.read_text().strip() if kept.is_file() else ""
    if key and _digest(key) in digests:
        return key
    key = "tlm-" + secrets.token_urlsafe(32)  # as `traylm keys add` makes them
    names = {**gateway.get("api_key_names", {}), _digest(key)[:8]: agent.name}
    write_bytes_atomic(kept, (key + "\n").encode(), mode=0o600)  # kept first: never lost
    await c.update_settings(
        {"gateway.api_key_sha256": [*digests, _digest(key)], "gateway.api_key_names": names}
    )
    say(f"made API key {agent.name!r} (fingerprint {_digest(key)[:8]}) for {agent.title}")
    return key


def _key_file(paths: Paths, agent: Agent) -> Path:
    return paths.state_dir / "launch" / f"{agent.name}.key"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()  # as engines.gateway.security.hash_key

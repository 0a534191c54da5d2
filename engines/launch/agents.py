"""The agent CLIs `traylm launch` runs, and how each is pointed at traylm through its own
environment variables and command-line config overrides (never the user's config files):

- Claude Code reads ``ANTHROPIC_BASE_URL`` (it appends ``/v1/messages``), sends
  ``ANTHROPIC_AUTH_TOKEN`` as ``Authorization: Bearer`` (which also skips its login), and takes
  its main, background and subagent models from ``ANTHROPIC_MODEL``,
  ``ANTHROPIC_DEFAULT_{OPUS,SONNET,HAIKU}_MODEL``, ``ANTHROPIC_SMALL_FAST_MODEL`` (older
  releases) and ``CLAUDE_CODE_SUBAGENT_MODEL``; traffic to Anthropic (telemetry, error reports,
  updates) is turned off with ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``.
- Codex takes ``-c key=value`` overrides of its config.toml: a ``traylm`` model provider
  (``base_url`` ending in /v1, ``wire_api = "responses"``, the key read from ``env_key``).
- opencode merges the JSON in ``OPENCODE_CONFIG_CONTENT`` over its config files: a ``traylm``
  provider on ``@ai-sdk/openai-compatible`` with the model listed.

Pure: given the gateway's URL, the key and the model, each returns argv and env.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

KEY_ENV = "TRAYLM_API_KEY"
"""The variable the key travels in, for the clients that name one (Codex, opencode)."""
NO_KEY = "traylm-no-key-needed"
"""Sent where the gateway asks loopback clients for no key: a client needs some token."""


@dataclass(frozen=True)
class Agent:
    name: str
    """As `traylm launch` takes it, and the name of its key."""
    title: str
    binary: str
    npm_package: str

    @property
    def install(self) -> str:
        return f"npm install -g {self.npm_package}"


AGENTS: dict[str, Agent] = {
    "claude": Agent("claude", "Claude Code", "claude", "@anthropic-ai/claude-code"),
    "codex": Agent("codex", "Codex", "codex", "@openai/codex"),
    "opencode": Agent("opencode", "opencode", "opencode", "opencode-ai"),
}


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]


def launch(
    agent: Agent,
    *,
    url: str,
    key: str,
    model: str,
    args: Sequence[str],
    environ: Mapping[str, str],
) -> Launch:
    """How to run ``agent`` against the gateway at ``url`` (http://HOST:PORT) with ``model``;
    ``args`` go to the client after traylm's own."""
    base = url.rstrip("/")
    env = dict(environ)
    if agent.name == "claude":
        env.pop("ANTHROPIC_API_KEY", None)  # with a token too, Claude Code asks which to use
        env.update(claude_env(base, key, model))
        return Launch([agent.binary, *args], env)
    env[KEY_ENV] = key
    if agent.name == "codex":
        return Launch([agent.binary, *codex_overrides(base, model), *args], env)
    env["OPENCODE_CONFIG_CONTENT"] = json.dumps(opencode_config(base, model))
    return Launch([agent.binary, *args], env)


def claude_env(base: str, key: str, model: str) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_AUTH_TOKEN": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def codex_overrides(base: str, model: str) -> list[str]:
    """``-c`` overrides: each value is TOML (strings quoted as JSON quotes them)."""
    values = {
        "model_provider": "traylm",
        "model": model,
        "model_providers.traylm.name": "traylm",
        "model_providers.traylm.base_url": f"{base}/v1",
        "model_providers.traylm.env_key": KEY_ENV,
        "model_providers.traylm.wire_api": "responses",
    }
    out = []
    for name, value in values.items():
        out += ["-c", f"{name}={json.dumps(value)}"]
    return out


def opencode_config(base: str, model: str) -> dict[str, object]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "traylm": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "traylm",
                "options": {"baseURL": f"{base}/v1", "apiKey": f"{{env:{KEY_ENV}}}"},
                "models": {model: {"name": model, "tool_call": True}},
            }
        },
        "model": f"traylm/{model}",
        "small_model": f"traylm/{model}",
        "autoupdate": False,
        "share": "disabled",
    }

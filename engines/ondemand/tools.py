"""Which servable models can call tools: an agent (Claude Code, Codex, opencode through
`traylm launch`) sends tools with every request, and vLLM answers them only with a tool calling
format (``tool_parser``). A model without one gets the gateway's own message naming the
command that sets one where its settings live (engines/gateway/capabilities.py)."""

from __future__ import annotations

from collections.abc import Sequence

from engines.config.profiles import Profile
from engines.gateway.capabilities import ServedAs, planned, tools_message


def tools_blocked(models: Sequence[tuple[str, Profile | None]], served_as: ServedAs) -> list[str]:
    """For each (name, profile it runs or would start from): why it cannot call tools, or ""
    when it can (a profile of another engine, an attached server: theirs to say). Blocking
    (reads config.json for the suggested format): run it in a thread."""
    out = []
    for name, profile in models:
        if profile is None or profile.engine != "vllm" or profile.tool_parser:
            out.append("")
            continue
        out.append(tools_message(planned(profile, served_as), name))
    return out

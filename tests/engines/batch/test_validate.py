"""Batch input checked before anything runs: each kind of wrong line is named with its number."""

from __future__ import annotations

import json

import pytest

from engines.batch.validate import parse_input
from engines.errors import ConfigError

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", **over: object) -> bytes:
    data = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {"model": "fake"}}
    data.update(over)
    return json.dumps(data).encode() + b"\n"


def test_good_input_parses_in_order() -> None:
    parsed = parse_input([line("a"), b"\n", line("b")], CHAT)
    assert [(p.number, p.custom_id, p.body["model"]) for p in parsed] == [
        (1, "a", "fake"),
        (3, "b", "fake"),
    ]


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (b"not json\n", "line 2: not a JSON object"),
        (b"[1, 2]\n", "line 2: not a JSON object"),
        (line("a"), "line 2: custom_id 'a' is also on line 1"),
        (line("b", url="/v1/embeddings"), "line 2: url '/v1/embeddings' is not the batch's"),
        (line("b", method="GET"), "line 2: method must be POST"),
        (line("b", body={"messages": []}), "line 2: body must be an object with a model"),
        (line("", url=CHAT), "line 2: custom_id must be text"),
    ],
)
def test_each_wrong_line_is_named(bad: bytes, words: str) -> None:
    with pytest.raises(ConfigError, match="not valid batch input") as caught:
        parse_input([line("a"), bad], CHAT)
    assert words in caught.value.message


def test_an_empty_file_is_refused() -> None:
    with pytest.raises(ConfigError, match="no requests"):
        parse_input([b"\n"], CHAT)

"""The file workload (engines/bench/replay.py): a flight-recorder export read as a benchmark's
requests, at its recorded pace or as fast as possible; a bad file gets an error naming the
line."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from engines.bench.load import Target, request_body, run_load
from engines.bench.replay import read_workload_file
from engines.core.procs import free_loopback_port
from engines.errors import ConfigError


def line(custom_id: str, url: str, at_s: float | None, **body: object) -> str:
    item: dict[str, object] = {"custom_id": custom_id, "method": "POST", "url": url}
    item["body"] = {"model": "recorded", **body}
    if at_s is not None:
        item["traylm"] = {"arrived_at_s": at_s}
    return json.dumps(item)


def test_recorded_pace_and_as_fast_as_possible(tmp_path: Path) -> None:
    f = tmp_path / "day.jsonl"
    f.write_text(
        "\n".join(
            [
                line("a", "/v1/chat/completions", 1000.0, messages=[], max_tokens=4),
                line("b", "/v1/embeddings", 1002.5, input="x"),
                "",
            ]
        )
    )
    paced = read_workload_file(f, paced=True)
    assert [s.at_s for s in paced] == [0.0, 2.5]
    assert [s.path for s in paced] == ["/v1/chat/completions", "/v1/embeddings"]
    assert paced[0].max_tokens == 4
    fast = read_workload_file(f, paced=False)
    assert [s.at_s for s in fast] == [None, None]
    target = Target(base_url="http://127.0.0.1:1/v1", model="other")
    chat = request_body(target, paced[0])
    assert chat["model"] == "other" and chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    emb = request_body(target, paced[1])
    assert emb == {"model": "other", "input": "x"}  # sent as recorded, to the benchmarked model
    assert target.url_of(paced[1]) == "http://127.0.0.1:1/v1/embeddings"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "day.jsonl:1: not JSON"),
        ('{"method": "GET", "url": "/v1/embeddings", "body": {}}', "method must be POST"),
        ('{"url": "/pause", "body": {}}', "url '/pause' is not one traylm replays"),
        ('{"url": "/v1/embeddings", "body": []}', "body must be the request's JSON object"),
        ("", "has no requests"),
    ],
)
def test_a_bad_file_names_the_line(tmp_path: Path, text: str, problem: str) -> None:
    f = tmp_path / "day.jsonl"
    f.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        read_workload_file(f, paced=True)


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="traylm requests export FILE"):
        read_workload_file(tmp_path / "nope.jsonl", paced=True)


async def test_the_recorded_pace_sets_the_send_times(tmp_path: Path) -> None:
    """Against a closed port every request fails at once; their start times still follow the
    recorded schedule (1 s apart), or not at all as fast as possible."""
    f = tmp_path / "day.jsonl"
    f.write_text(
        "\n".join(line(str(i), "/v1/embeddings", 50.0 + 1.0 * i, input="x") for i in range(2))
    )
    target = Target(base_url=f"http://127.0.0.1:{free_loopback_port()}/v1", model="m")
    seconds = []  # when the second request went, from the start
    for paced in (True, False):
        async with aiohttp.ClientSession() as http:
            specs = read_workload_file(f, paced=paced)
            result = await run_load(http, target, specs, concurrency=8)
        seconds.append(max(t.start_s for t in result.timings) - result.start_s)
    assert seconds[0] >= 1.0 and seconds[1] < 0.5

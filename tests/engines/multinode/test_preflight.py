"""Preflight of a model across boxes, each failure naming the box and its fix: the head's
real preflight and ranks (engines/multinode/head.py) against FakeBoxChannel, which answers
as box B's peer API would (the real channel runs in tests/engines/peers/test_spread_vllm.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from engines.config.profiles import profile_from_mapping
from engines.errors import PeerUnreachable, PreflightFailed
from engines.multinode.digest import model_digest
from engines.multinode.head import HeadRanks, preflight
from engines.multinode.network import link_meaning
from engines.multinode.preflight import Facts, compare
from engines.runtime.adapters.base import EngineRuntime, FlagSet

RUNTIME = EngineRuntime("vllm", Version("0.32.0"), Path("/e/bin/python"), Path("/e/bin"), "cpu",
                        FlagSet("vllm", "0.32.0", {}))  # fmt: skip


class FakeBoxChannel:
    """FAKE box B behind the paired channel: its facts, its firewall, its rank."""

    box_name = "box-a"

    def __init__(self, **facts: Any) -> None:
        self.facts = {"box": "box-b", "engine_version": "0.32.0", "engine_problem": "",
                      "model_problem": "", "time_s": 0.0, "interface": "lo",
                      "address": "127.0.0.1", **facts}  # fmt: skip
        self.firewall = False
        self.calls: list[tuple[str, str]] = []
        self.rank_state = "running"

    def address(self, box: str) -> str:
        return "127.0.0.1:8471"

    async def call(self, box: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
        self.calls.append((method, path))
        if path == "/peer/spread/facts":
            return {**self.facts, "time_s": self.facts["time_s"] or time.time()}
        if path == "/peer/spread/reach":
            if self.firewall:  # what box B's connect() meets behind a DROP rule
                return {"reached": False, "error": "timed out"}
            _, writer = await asyncio.open_connection(body["host"], body["port"])
            writer.close()
            return {"reached": True, "error": ""}
        if path.startswith("/peer/spread/ranks/") and method == "GET":
            return {"state": self.rank_state, "why": "rank box-a.big on box-b exited with code -9"}
        return {"rank_id": "box-a.big", "interface": "lo"}

    async def upload(self, box: str, path: str, blob: bytes) -> None:
        self.calls.append(("POST", path))

    async def round_trip(self, box: str) -> float:
        return 0.0005


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 128}))
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    return folder


def profile(model: Path) -> Any:
    return profile_from_mapping("big", {"model": str(model), "device": "cpu",
                                        "boxes": ["box-b"], "pipeline_parallel_size": 2})  # fmt: skip


async def test_matching_boxes_pass_and_the_link_is_explained(model: Path) -> None:
    channel = FakeBoxChannel(model_digest=model_digest(model))
    found = await preflight(channel, profile(model), RUNTIME, str(model))
    assert found.findings == []
    assert found.route is not None and found.route.address == "127.0.0.1"
    [note] = found.notes
    assert "link to box 'box-b'" in note and "Mbit/s" in note and "512 bytes" in note
    assert "0.5 ms round trip" in note and "at most 2,000 tokens/s" in note


async def test_a_version_mismatch_names_the_box_and_the_install(model: Path) -> None:
    channel = FakeBoxChannel(model_digest=model_digest(model), engine_version="0.31.0")
    ranks = HeadRanks(channel=channel, profile=profile(model), runtime=RUNTIME,
                      model=str(model), lease_s=5, poll_s=0.05)  # fmt: skip
    with pytest.raises(PreflightFailed) as err:
        await ranks.begin(lambda _: None)
    assert "box-b runs vLLM 0.31.0, box-a runs 0.32.0" in err.value.message
    assert "`traylm engines install vllm --version 0.32.0` on box-b" in err.value.message
    assert ("POST", "/peer/spread/ranks") not in channel.calls  # nothing started anywhere


async def test_different_model_bytes_are_refused(model: Path) -> None:
    other = model.parent / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"hidden_size": 128}))
    (other / "model.safetensors").write_bytes(b"weights" * 99 + b"changed")
    channel = FakeBoxChannel(model_digest=model_digest(other))
    found = await preflight(channel, profile(model), RUNTIME, str(model))
    [finding] = found.blocking
    assert finding.box == "box-b" and finding.check == "model"
    assert "the model's files on box-b differ from box-a's" in finding.text
    assert "copy the same folder" in finding.text


async def test_a_closed_rendezvous_port_is_named_with_the_fix(model: Path) -> None:
    channel = FakeBoxChannel(model_digest=model_digest(model))
    channel.firewall = True
    found = await preflight(channel, profile(model), RUNTIME, str(model))
    [finding] = found.blocking
    assert finding.check == "port"
    assert f"box-b cannot reach the rendezvous port 127.0.0.1:{found.master_port}" in finding.text
    assert "open TCP ports from box-b to box-a" in finding.text


async def test_a_missing_model_and_engine_and_a_far_clock_each_say_what_to_do(
    model: Path,
) -> None:
    channel = FakeBoxChannel(
        model_digest="", model_problem="the model is not on box-b: /m does not exist",
        engine_version="", engine_problem="no vllm 0.32.0 for cpu is installed",
        time_s=time.time() + 3600,
    )  # fmt: skip
    found = await preflight(channel, profile(model), RUNTIME, str(model))
    texts = {f.check: f.text for f in found.blocking}
    assert "run `traylm engines install vllm --version 0.32.0` on box-b" in texts["engine"]
    assert "the model is not on box-b" in texts["model"]
    assert "box-b's clock is +3600 s off box-a's" in texts["clock"]
    assert "timedatectl set-ntp true" in texts["clock"]


def test_a_small_skew_is_a_warning_only() -> None:
    facts = Facts("box-b", "0.32.0", "", "d", "", 0.0, "tailscale0", "100.64.0.2")
    own = Facts("box-a", "0.32.0", "", "d", "", 0.0, "", "")
    found = compare(own, facts, skew_s=5.0)
    assert [(f.check, f.blocking) for f in found] == [("clock", False), ("interface", False)]
    assert "over tailscale0 (a container bridge or VPN)" in found[1].text


async def test_a_rank_that_ends_there_is_the_problem_and_end_stops_it(model: Path) -> None:
    channel = FakeBoxChannel(model_digest=model_digest(model))
    ranks = HeadRanks(channel=channel, profile=profile(model), runtime=RUNTIME,
                      model=str(model), lease_s=5, poll_s=0.05)  # fmt: skip
    head = await ranks.begin(lambda _: None)
    assert "--nnodes" in head.extra_flags and head.env["VLLM_HOST_IP"] == "127.0.0.1"
    assert ranks.problem() is None
    channel.rank_state = "ended"
    deadline = time.monotonic() + 5
    while ranks.problem() is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert "the rank on box-b ended: rank box-a.big on box-b exited with code -9" in str(
        ranks.problem()
    )
    await ranks.end()
    assert ("DELETE", "/peer/spread/ranks/box-a.big") in channel.calls


async def test_a_box_that_stops_answering_is_the_problem(model: Path) -> None:
    channel = FakeBoxChannel(model_digest=model_digest(model))
    ranks = HeadRanks(channel=channel, profile=profile(model), runtime=RUNTIME,
                      model=str(model), lease_s=5, poll_s=0.02)  # fmt: skip
    await ranks.begin(lambda _: None)

    async def silent(*_: Any) -> dict[str, Any]:
        raise PeerUnreachable("box 'box-b' at 10.0.0.2:8471 did not answer in time")

    channel.call = silent  # type: ignore[method-assign]
    deadline = time.monotonic() + 5
    while ranks.problem() is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert "box-b stopped answering: box 'box-b' at 10.0.0.2:8471 did not answer" in str(
        ranks.problem()
    )
    await ranks.end()


def test_what_a_slow_link_means() -> None:
    meaning = link_meaning(box="box-b", bandwidth_bytes_s=100e6 / 8, rtt_s=0.002,
                           hidden_size=8192, dtype_bytes=2)  # fmt: skip
    assert meaning.bytes_per_token == 32768
    assert round(meaning.prefill_tokens_per_s) == 381 and round(meaning.decode_tokens_per_s) == 500
    assert "below 1 Gbit/s" in meaning.text

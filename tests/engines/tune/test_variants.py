"""Quantized variants present locally as tuner candidates: tiny model folders built here (no
download), matched by the model card's base_model or by the same architecture and size."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engines.config.profiles import profile_from_mapping
from engines.events import TuneConfig, TuneState
from engines.tune.candidates import Machine, machine_candidates
from engines.tune.variants import ModelOnDisk, Variant, quantized_variants
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.tune.test_daemon import TOKEN_S, nothing_of_the_tune_left, tune_to_end
from tests.fakes.fake_trt_env import make_tiny_hf_model

SHAPE = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
         "vocab_size": 512}  # fmt: skip


def folder(root: Path, name: str, *, quant: str = "", card: str = "", **config: Any) -> Path:
    path = root / name
    path.mkdir()
    data = {**SHAPE, **config}
    if quant:
        data["quantization_config"] = {"quant_method": quant, "bits": 4}
    (path / "config.json").write_text(json.dumps(data))
    if card:
        (path / "README.md").write_text(card)
    return path


def test_variants_by_the_model_card_or_by_the_same_shape(tmp_path: Path) -> None:
    base = folder(tmp_path, "chat")
    local = [
        ModelOnDisk("org/chat", base),
        ModelOnDisk("org/chat-AWQ", folder(tmp_path, "awq", quant="awq")),  # same shape
        ModelOnDisk(  # another size, but its card names the model it was made from
            str(tmp_path / "gptq"),
            folder(
                tmp_path,
                "gptq",
                quant="gptq",
                hidden_size=128,
                card="---\nbase_model: Org/Chat\nlicense: mit\n---\n# gptq\n",
            ),
        ),
        ModelOnDisk(
            "org/other-FP8",
            folder(
                tmp_path,
                "other",
                quant="fp8",
                hidden_size=96,
                card="---\nbase_model: [org/other]\n---\n",
            ),
        ),
        ModelOnDisk("org/chat-copy", folder(tmp_path, "copy")),  # same shape, not quantized
        ModelOnDisk("org/chat-odd", folder(tmp_path, "odd", quant="madeup")),  # unknown method
        ModelOnDisk(
            "org/chat-bad-card",
            folder(tmp_path, "bad", quant="fp8", card="---\nbase_model: [org/chat\n---\n"),
        ),
    ]
    assert quantized_variants("org/chat", local) == [
        Variant("org/chat-AWQ", "awq"),
        Variant(str(tmp_path / "gptq"), "gptq"),
        Variant("org/chat-bad-card", "fp8"),  # the card unreadable: matched by its shape
    ]
    # the profile naming the folder itself, not a repo id
    assert [v.model for v in quantized_variants(str(base), local[1:3])] == ["org/chat-AWQ"]
    # a model not on this computer: only a card can say what it was made from
    assert quantized_variants("org/chat", local[1:3]) == [Variant(str(tmp_path / "gptq"), "gptq")]
    # a quantized profile model has no quantized variant to try
    assert quantized_variants("org/chat-AWQ", local) == []


def test_a_variant_candidate_serves_the_folder_under_the_profiles_name() -> None:
    base = profile_from_mapping("chat", {"model": "org/chat", "quantization": "awq"})
    machine = Machine("cuda", 1, frozenset({"vllm"}), 8, (Variant("/m/chat-AWQ", "awq"),))
    (c,) = [c for c in machine_candidates(base, machine) if c.key.startswith("quant-")]
    assert (c.key, c.label) == ("quant-chat-AWQ", "awq variant /m/chat-AWQ")
    run = c.profile(base, name="tune-chat")
    assert (run.model, run.quantization, run.effective_served_name) == ("/m/chat-AWQ", None, "chat")
    assert not c.gpu_only


@pytest.mark.slow
async def test_a_registered_awq_folder_of_the_model_is_measured_through_the_daemon(
    daemon_factory: Any, fake_env: Path, tmp_path: Path
) -> None:
    """A folder in the library (`traylm models add`) whose card says it is org/chat in AWQ: a
    candidate, started (FAKE engine) from that folder under the name chat, measured twice."""
    d: RunningDaemon = await daemon_factory()
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}")
    awq = make_tiny_hf_model(tmp_path / "chat-AWQ")
    config = json.loads((awq / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (awq / "config.json").write_text(json.dumps(config))
    (awq / "README.md").write_text("---\nbase_model: org/chat\n---\n")
    await asyncio.to_thread(d.daemon.hub.folders.add, awq, name="chat-awq")
    job = await tune_to_end(d, TuneConfig(model="chat", concurrency=2, requests=4,
                                          only=("quant-chat-AWQ",)))  # fmt: skip
    assert job.state == TuneState.DONE, job.detail
    row = next(r for r in job.rows if r.key == "quant-chat-AWQ")
    assert row.runs == 2 and row.label == f"awq variant {awq}", row
    log = (d.paths.logs_dir / "engines" / "tune-chat.log").read_text()
    argvs = [line for line in log.splitlines() if line.startswith("===== argv:")]
    assert len(argvs) == 4 and sum(f" {awq} " in a for a in argvs) == 2, argvs  # A B A B
    await nothing_of_the_tune_left(d, {"chat"})

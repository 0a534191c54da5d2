"""`traylm start --model M` (an ad-hoc profile) gets the model family's tool-call and reasoning
parsers, from the repo id or the local folder's config.json, unless the request names them."""

from __future__ import annotations

import json
from pathlib import Path

from engines.control.service import adhoc_profile


def test_parsers_come_from_the_model_family() -> None:
    p = adhoc_profile({"model": "Qwen/Qwen3-8B"})
    assert (p.tool_parser, p.reasoning_parser) == ("hermes", "qwen3")
    p = adhoc_profile({"model": "Qwen/Qwen3-8B", "tool_parser": ""})  # asked for off
    assert (p.tool_parser, p.reasoning_parser) == ("", "qwen3")
    p = adhoc_profile({"model": "org/unknown-model"})
    assert (p.tool_parser, p.reasoning_parser) == ("", "")
    p = adhoc_profile({"model": "org/x", "engine": "sglang"})
    assert p.tool_parser == ""


def test_a_local_folder_is_recognised_by_its_config(tmp_path: Path) -> None:
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}})
    )
    assert adhoc_profile({"model": str(folder)}).tool_parser == "llama3_json"

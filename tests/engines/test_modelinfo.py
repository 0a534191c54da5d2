"""A model's config.json and sentence-transformers marker, read from a local folder (nothing is
downloaded; a model not on disk has no info)."""

from __future__ import annotations

import json
from pathlib import Path

from engines.modelinfo import read_model_info


def test_local_folder_config_and_pooling_module(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    )
    info = read_model_info(str(tmp_path))
    assert info is not None
    assert info.architectures == ("Qwen3ForCausalLM",) and info.model_type == "qwen3"
    assert not info.sentence_transformers
    modules = [{"idx": 1, "type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert read_model_info(str(tmp_path)).sentence_transformers  # type: ignore[union-attr]


def test_missing_or_broken_configs_give_no_info(tmp_path: Path) -> None:
    assert read_model_info(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("{broken")
    assert read_model_info(str(tmp_path)) is None
    assert read_model_info("no-such-org/no-such-model-anywhere") is None
    assert read_model_info("not a repo id") is None

"""A model's config.json and sentence-transformers marker, read from a local folder (nothing is
downloaded; a model not on disk has no info)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engines.core.modelinfo import ConfigUnreadable, folder_config, read_model_info


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


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no config.json"),
        ("{broken", "config.json is not readable JSON"),
        ("[1, 2]", "config.json is not a JSON object"),
    ],
)
def test_a_folder_config_that_cannot_be_read_says_why(
    tmp_path: Path, text: str | None, why: str
) -> None:
    if text is not None:
        (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigUnreadable, match=why):
        folder_config(tmp_path)


def test_one_module_reads_a_model_folders_config_json() -> None:
    """Every reader of a model's config.json goes through core/modelinfo.py (the TensorRT-LLM
    cache reads a built engine's own config.json, another file)."""
    root = Path(__file__).resolve().parents[3] / "engines"
    readers = {
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if re.search(r'"config\.json"\)\.read_text|json\.load\(.*config\.json', p.read_text())
    }
    assert readers == {"trt/cache.py"}

"""Which repo files traylm fetches: engine files only, never pickles, one copy of the weights."""

from __future__ import annotations

import pytest

from engines.errors import NoSafetensors
from engines.hub.selection import RepoEntry, select_files


def entries(*paths: str) -> list[RepoEntry]:
    return [
        RepoEntry(p, 10, "0" * 40, "a" * 64 if p.endswith(".safetensors") else None) for p in paths
    ]


def test_keeps_engine_files_and_explains_each_skip() -> None:
    sel = select_files(
        "org/m",
        entries(
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "tokenizer.model",
            "chat_template.jinja",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "consolidated.safetensors",
            "pytorch_model.bin",
            "model.gguf",
            "README.md",
            "original/consolidated.00.pth",
            "modeling_x.py",
        ),
    )
    kept = {e.path for e in sel.keep}
    assert kept == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "chat_template.jinja",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    }
    why = dict(s.split(" (", 1) for s in sel.skipped)
    assert why["pytorch_model.bin"].startswith("pickle")
    assert why["consolidated.safetensors"].startswith("second copy")
    assert why["original/consolidated.00.pth"].startswith("not at the top")
    assert why["modeling_x.py"].startswith("repo code")


def test_mistral_only_format_keeps_consolidated_weights_and_code_when_trusted() -> None:
    sel = select_files(
        "org/m",
        entries("config.json", "consolidated.safetensors", "modeling_x.py"),
        include_code=True,
    )
    assert {e.path for e in sel.keep} == {
        "config.json",
        "consolidated.safetensors",
        "modeling_x.py",
    }


def test_pickle_only_repos_are_refused_with_a_reason() -> None:
    with pytest.raises(NoSafetensors) as err:
        select_files("org/old", entries("config.json", "pytorch_model.bin"))
    assert "can run code" in err.value.message
    with pytest.raises(NoSafetensors):
        select_files("org/gguf", entries("config.json", "model-q4.gguf"))

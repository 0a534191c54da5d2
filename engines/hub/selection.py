"""Which files of a repo an engine needs, and which traylm refuses to fetch.

Kept: safetensors weights (and their index), config.json, generation_config.json, tokenizer
files, chat templates and processor configs, at the top level of the repo. Never fetched: pickle
weights (``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``: loading one can run code), GGUF,
ONNX, docs and images, and a second copy of the weights in Mistral's ``consolidated`` format when
Hugging Face shards exist. Python files only when the user trusted the repo's code.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from engines.errors import NoSafetensors
from engines.hub.names import validate_filename

CONFIG_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
        "params.json",
        "tekken.json",
        "quant_config.json",
        "quantize_config.json",
        "hf_quant_config.json",
        "model.safetensors.index.json",
    }
)
TOKENIZER_GLOBS = ("*.tiktoken",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


@dataclass(frozen=True)
class RepoEntry:
    """One file of a repo at a commit, as the Hub lists it."""

    path: str
    size_bytes: int
    git_sha1: str
    sha256: str | None  # LFS files only


@dataclass(frozen=True)
class Selection:
    keep: tuple[RepoEntry, ...]
    skipped: tuple[str, ...]  # "path (why)"


def file_kind(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".safetensors"):
        return "weights"
    if name.endswith(".py"):
        return "code"
    if "token" in name or name in ("vocab.json", "vocab.txt", "merges.txt", "tekken.json"):
        return "tokenizer"
    if name.startswith("chat_template"):
        return "chat_template"
    return "config"


def select_files(
    repo_id: str, entries: Iterable[RepoEntry], *, include_code: bool = False
) -> Selection:
    """Pick the files to download. Raises NoSafetensors when the weights exist only as pickles."""
    all_entries = list(entries)
    for e in all_entries:
        validate_filename(e.path)
    top = [e for e in all_entries if "/" not in e.path]
    hf_shards = [e for e in top if e.path.endswith(".safetensors") and _is_hf_weight(e.path)]
    keep: list[RepoEntry] = []
    skipped: list[str] = []
    for e in all_entries:
        why = _skip_reason(e, hf_shards_exist=bool(hf_shards), include_code=include_code)
        if why:
            skipped.append(f"{e.path} ({why})")
        else:
            keep.append(e)
    if not any(e.path.endswith(".safetensors") for e in keep):
        pickles = [e.path for e in all_entries if e.path.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise NoSafetensors(
                f"{repo_id} has weights only as pickle files ({', '.join(pickles[:3])}), which can "
                "run code when loaded; traylm fetches safetensors only: look for a safetensors "
                "version of this model"
            )
        raise NoSafetensors(
            f"{repo_id} has no safetensors weights at the top of the repo; it is not a model "
            "an engine can load (GGUF and ONNX repos are not supported)"
        )
    if not any(e.path == "config.json" for e in keep):
        raise NoSafetensors(f"{repo_id} has no config.json; engines cannot load it")
    return Selection(tuple(sorted(keep, key=lambda e: (e.size_bytes, e.path))), tuple(skipped))


def _is_hf_weight(path: str) -> bool:
    return path.startswith("model") or not path.startswith("consolidated")


def _skip_reason(e: RepoEntry, *, hf_shards_exist: bool, include_code: bool) -> str:
    path = e.path
    if "/" in path:
        return "not at the top of the repo"
    if path.endswith(PICKLE_SUFFIXES):
        return "pickle weights are never fetched"
    if path.endswith(".safetensors"):
        if hf_shards_exist and not _is_hf_weight(path):
            return "second copy of the weights in Mistral format"
        return ""
    if path.endswith(".py"):
        return "" if include_code else "repo code: only fetched when you trust this model"
    if path in CONFIG_FILES or any(fnmatch.fnmatch(path, g) for g in TOKENIZER_GLOBS):
        return ""
    return "not needed by an engine"

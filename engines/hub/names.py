"""Validation of repo ids, revisions and file names, done BEFORE anything touches the disk.

Path traversal through model names has happened for real (Ollama "Probllama", CVE-2024-37032;
huggingface_hub file names that escaped the cache). Everything that becomes part of a path goes
through one of these functions first; each raises ``InvalidName`` (HTTP 400) saying what is wrong
and what a valid value looks like.
"""

from __future__ import annotations

import re
import unicodedata

from engines.errors import InvalidName

__all__ = ["InvalidName"]

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID_RE = re.compile(rf"^{_PART}/{_PART}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_WINDOWS_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def validate_repo_id(repo_id: str) -> str:
    """``org/name`` with letters, digits, ``.``, ``_`` and ``-``; no ``..``, no ``--``.

    ``--`` is refused because the cache folder is ``models--org--name``: a name holding ``--``
    could alias another repo's folder.
    """
    if not isinstance(repo_id, str) or not repo_id:
        raise InvalidName("a model is named org/name, e.g. Qwen/Qwen2.5-7B-Instruct")
    shown = repo_id[:120]
    if _has_control(repo_id):
        raise InvalidName(f"{shown!r} contains control characters; a model is named org/name")
    if ".." in repo_id or "--" in repo_id:
        raise InvalidName(
            f"{shown!r} is not a valid model name ('..' and '--' are not allowed); "
            "a model is named org/name, e.g. Qwen/Qwen2.5-7B-Instruct"
        )
    if not REPO_ID_RE.match(repo_id):
        raise InvalidName(
            f"{shown!r} is not a Hugging Face model name: use org/name with letters, digits, "
            "'.', '_' or '-' (e.g. Qwen/Qwen2.5-7B-Instruct)"
        )
    return repo_id


def validate_revision(revision: str | None) -> str | None:
    """A branch, tag or commit sha. Slashes are allowed (``refs/pr/1``) but no ``..``."""
    if revision is None or revision == "":
        return None
    if _has_control(revision) or ".." in revision or "//" in revision or revision.endswith("/"):
        raise InvalidName(f"revision {revision[:80]!r} is not a branch, tag or commit sha")
    if not _REVISION_RE.match(revision):
        raise InvalidName(
            f"revision {revision[:80]!r} is not a branch, tag or commit sha "
            "(letters, digits, '.', '_', '-', '/')"
        )
    return revision


def validate_filename(filename: str) -> str:
    """A relative, '/'-separated path inside a repo: no absolute, drive, UNC or '..' parts."""
    shown = filename[:160] if isinstance(filename, str) else repr(filename)
    if not isinstance(filename, str) or not filename:
        raise InvalidName("an empty file name is not a repo file")
    if _has_control(filename):
        raise InvalidName(f"file name {shown!r} contains control characters")
    if "\\" in filename:
        raise InvalidName(f"file name {shown!r} uses '\\'; repo paths use '/' only")
    if filename.startswith("/") or _WINDOWS_DRIVE_RE.match(filename):
        raise InvalidName(f"file name {shown!r} is an absolute path; repo paths are relative")
    parts = filename.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidName(f"file name {shown!r} has an empty, '.' or '..' part (path traversal)")
    if len(filename) > 1000:
        raise InvalidName(f"file name {shown}... is longer than 1000 characters")
    return filename


def validate_commit(sha: str) -> str:
    if not COMMIT_RE.match(sha or ""):
        raise InvalidName(f"{(sha or '')[:80]!r} is not a 40-character commit sha")
    return sha


def cache_folder_name(repo_id: str) -> str:
    """The HF cache folder of a model repo (``models--org--name``), after validation."""
    return "models--" + validate_repo_id(repo_id).replace("/", "--")


def repo_id_from_cache_folder(folder: str) -> str | None:
    """``models--org--name`` → ``org/name``; None for anything that is not a valid model folder."""
    if not folder.startswith("models--"):
        return None
    parts = folder[len("models--") :].split("--")
    if len(parts) != 2:
        return None
    candidate = f"{parts[0]}/{parts[1]}"
    try:
        return validate_repo_id(candidate)
    except InvalidName:
        return None


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch).startswith("C") for ch in text)

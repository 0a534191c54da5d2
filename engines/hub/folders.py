"""Model folders on this computer, registered in the library (``traylm models add PATH``).

A registered folder is servable by name like a downloaded model: ``traylm start NAME`` (and the
tray) builds a profile from the entry. Each entry is one TOML file under
``Paths.local_models_dir`` (``NAME.toml``: path, served name, engine guess, family, tool-call
and reasoning parsers), written only after the folder passed the check: a config.json that
names an architecture, weights (safetensors, every shard an index names, or PyTorch .bin files)
and a tokenizer. A folder deleted after it was registered is listed with what is missing, never
served. Blocking methods: the daemon calls them through ``asyncio.to_thread``.

The parsers are the folder's own settings, as a profile's ``tool_parser`` and
``reasoning_parser`` are: given to ``traylm models add`` or else its family's (as the presets
carry theirs), changed with ``traylm models set NAME tool_parser=...``. An entry written before
they existed gets its family's when read.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.config.profiles import Profile, profile_from_mapping
from engines.config.tomlfile import write_toml_atomic
from engines.core.modelinfo import ConfigUnreadable, folder_config
from engines.errors import ConfigError, ModelNotFound, quoted
from engines.events.hub import FOLDER_SETTINGS, LocalFolder
from engines.hub.library import TRTLLM_ARCHITECTURES
from engines.hub.shape import parse_config
from engines.runtime.adapters.vllm_models import Parsers, family_parsers

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")
FIX = (
    "point at the folder that holds config.json, the weights (*.safetensors) and the tokenizer "
    "(tokenizer.json)"
)
SETTINGS = FOLDER_SETTINGS
"""What ``traylm models set NAME KEY=VALUE`` changes in an entry (the profile fields of the same
names: vLLM's --tool-call-parser and --reasoning-parser; "" turns one off)."""


@dataclass(frozen=True)
class FolderCheck:
    """What a folder holds; ``problems`` empty means it can be served."""

    path: Path
    config: dict[str, Any]
    weights_bytes: int
    weight_files: int
    problems: tuple[str, ...]


def check_folder(path: Path) -> FolderCheck:
    """Read a folder as a Hugging Face model: config, weights, tokenizer."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        return FolderCheck(path, {}, 0, 0, (f"{path} {what}",))
    problems: list[str] = []
    config = _config(path, problems)
    weights_bytes, count = _weights(path, problems)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer ({' or '.join(TOKENIZER_FILES[:2])})")
    return FolderCheck(path, config, weights_bytes, count, tuple(problems))


def _config(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        data = folder_config(path)
    except ConfigUnreadable as exc:
        problems.append(str(exc))
        return {}
    if not (data.get("architectures") or data.get("model_type")):
        problems.append("config.json names no architecture or model_type")
        return {}
    return data


def _weights(path: Path, problems: list[str]) -> tuple[int, int]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            problems.append(f"{index.name} is not readable ({exc})")
            return 0, 0
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            problems.append(f"weight shards missing: {', '.join(missing[:3])}")
        present = [path / s for s in shards if (path / s).is_file()]
    else:
        present = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
        if not present:
            problems.append("no weights (*.safetensors or pytorch_model*.bin)")
    return sum(p.stat().st_size for p in present), len(present)


class FolderRegistry:
    """The registered folders: one TOML file each in ``models_dir``."""

    def __init__(self, models_dir: Path) -> None:
        self._dir = models_dir

    def add(
        self, path: Path, *, name: str | None = None, settings: dict[str, str] | None = None
    ) -> LocalFolder:
        """Check the folder and register it; raises ConfigError with what is wrong and the
        fix. Registering the same folder again under its name updates the entry. ``settings``:
        its parsers (``SETTINGS``); those not given are its family's (or, registered again,
        the ones it had)."""
        path = path.expanduser().resolve()
        check = check_folder(path)
        if check.problems:
            raise ConfigError(f"{path} is not a model folder: {'; '.join(check.problems)}; {FIX}")
        name = name or _name_for(path)
        if not NAME_RE.match(name):
            raise ConfigError(
                f"name {name!r} must be 1-64 letters, digits, '.', '_' or '-'; pass --name"
            )
        existing = self._read(name)
        if existing is not None and existing.path != str(path):
            raise ConfigError(
                f"{name!r} already names {existing.path}; pick another with --name, or remove "
                f"it first (`traylm models rm {name}`)"
            )
        shape = parse_config(check.config)
        parsers = family_parsers(str(path), check.config)
        if existing is not None:  # registered again: the settings it had stay
            parsers = Parsers(existing.tool_parser, existing.reasoning_parser)
        entry: dict[str, Any] = {
            "path": str(path),
            "served_name": name,
            "engine": "vllm",
            "engines": _engines(shape.architecture),
            "family": shape.model_type,
            "architecture": shape.architecture,
            "added_s": time.time(),
            "tool_parser": parsers.tool,
            "reasoning_parser": parsers.reasoning,
        }
        entry.update(_checked(name, entry, settings or {}))
        write_toml_atomic(self._dir / f"{name}.toml", entry)
        folder = self._read(name)
        assert folder is not None
        return folder

    def update(self, name: str, settings: dict[str, str]) -> LocalFolder:
        """Change a registered folder's settings (``SETTINGS``); raises ConfigError naming the
        keys it takes. An engine serving it keeps the old ones until it is started again."""
        folder = self.get(name)
        file = self._dir / f"{name}.toml"
        try:
            entry = tomllib.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the entry of {name!r} ({file}) is not readable: {exc}") from exc
        entry.setdefault("tool_parser", folder.tool_parser)
        entry.setdefault("reasoning_parser", folder.reasoning_parser)
        entry.update(_checked(name, entry, settings))
        write_toml_atomic(file, entry)
        updated = self._read(name)
        assert updated is not None
        return updated

    def ensure(self, path: Path, *, name: str) -> LocalFolder | None:
        """Register ``path`` under ``name`` unless an entry has that folder already (or the
        name is taken, or it is not a model folder): the new entry, else None."""
        path = path.expanduser().resolve()
        if any(f.path == str(path) for f in self.list()) or self._read(name) is not None:
            return None
        try:
            return self.add(path, name=name)
        except ConfigError:
            return None

    def list(self) -> list[LocalFolder]:
        if not self._dir.is_dir():
            return []
        found = (self._read(p.stem) for p in sorted(self._dir.glob("*.toml")))
        return [f for f in found if f is not None]

    def get(self, name: str) -> LocalFolder:
        folder = self._read(name) if NAME_RE.match(name) else None
        if folder is None:
            raise ModelNotFound(
                f"no model folder named {quoted(name)} in the library; "
                "`traylm models ls` lists them"
            )
        return folder

    def remove(self, name: str) -> LocalFolder:
        """Forget a folder (the files stay where they are)."""
        folder = self.get(name)
        (self._dir / f"{name}.toml").unlink()
        return folder

    def profile_for(self, name: str) -> Profile | None:
        """A profile that serves the registered folder ``name`` (None: no such folder); raises
        ConfigError when the folder can no longer be served."""
        folder = self._read(name) if NAME_RE.match(name) else None
        if folder is None:
            return None
        if folder.problems:
            raise ConfigError(
                f"the model folder {name!r} ({folder.path}) cannot be served: "
                f"{'; '.join(folder.problems)}; put it back, or remove it from the library "
                f"(`traylm models rm {name}`)"
            )
        return folder_profile(folder, str(self._dir / f"{name}.toml"))

    def _read(self, name: str) -> LocalFolder | None:
        file = self._dir / f"{name}.toml"
        if not file.is_file():
            return None
        try:
            data = tomllib.loads(file.read_text())
            path = Path(str(data["path"]))
        except (OSError, ValueError, KeyError):
            return None  # not an entry traylm wrote: ignored, like a stray file
        check = check_folder(path)
        if "tool_parser" in data and "reasoning_parser" in data:
            tool, reasoning = str(data["tool_parser"]), str(data["reasoning_parser"])
        else:  # an entry written before folders had parsers: its family's, as at add
            parsers = family_parsers(str(path), check.config)
            tool = str(data.get("tool_parser", parsers.tool))
            reasoning = str(data.get("reasoning_parser", parsers.reasoning))
        return LocalFolder(
            name=name,
            path=str(path),
            served_name=str(data.get("served_name") or name),
            engine=str(data.get("engine", "vllm")),
            engines=tuple(str(e) for e in data.get("engines", ("vllm",))),
            family=str(data.get("family", "")),
            architecture=str(data.get("architecture", "")),
            size_bytes=check.weights_bytes,
            added_s=float(data.get("added_s", 0.0)),
            problems=check.problems,
            tool_parser=tool,
            reasoning_parser=reasoning,
        )


def folder_profile(folder: LocalFolder, source: str) -> Profile:
    """The profile that serves a registered folder by its name: the planner places it when it
    loads (``gpus = "auto"``), like a downloaded library model."""
    data = {
        "model": folder.path,
        "served_name": folder.served_name,
        "engine": folder.engine,
        "gpus": "auto",
        "description": f"the model folder {folder.path}",
    }
    if folder.engine == "vllm":
        data |= {"tool_parser": folder.tool_parser, "reasoning_parser": folder.reasoning_parser}
    return profile_from_mapping(folder.name, data, source)


def _checked(name: str, entry: dict[str, Any], settings: dict[str, str]) -> dict[str, str]:
    """``settings`` when they are known keys and make a valid profile with ``entry``; else
    ConfigError with what is wrong and what it takes."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ConfigError(
            f"a model folder has no setting {', '.join(map(repr, unknown))}; it takes "
            f"{' and '.join(SETTINGS)} (for example tool_parser=hermes; empty turns it off)"
        )
    wrong = sorted(k for k, v in settings.items() if not isinstance(v, str))
    if wrong:
        raise ConfigError(f"{', '.join(wrong)} must be text (a parser name, or empty for off)")
    fields = {k: str(entry.get(k, "")) for k in SETTINGS} | settings
    data = {"model": str(entry["path"]), "engine": str(entry.get("engine", "vllm")), **fields}
    profile_from_mapping(name, data, f"model folder {name!r}")
    return settings


def _name_for(path: Path) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "-", path.name).strip(".-_")[:64]
    return base or "model"


def _engines(architecture: str) -> list[str]:
    return ["vllm", "trtllm"] if architecture in TRTLLM_ARCHITECTURES else ["vllm"]

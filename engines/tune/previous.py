"""`traylm tune --apply` and `--undo`: the profile the tuner replaced, kept so it can be put back.

``apply`` keeps the profile file as it was before the first apply (``<name>.toml`` in the
tuner's folder; a shipped preset that had no user file leaves a ``<name>.preset`` marker), then
writes the new profile. A second apply keeps the first one's original: `--undo` always goes back
to the profile the user had before tuning. ``undo`` writes it back (or removes the user file
over a preset) and forgets it. A power candidate's apply keeps the GPUs' persisted power limits
it replaced the same way (``<name>.power.json``, engines/tune/power.py). Blocking file I/O: call
from a thread.
"""

from __future__ import annotations

import json
from pathlib import Path

from engines.config.profiles import Profile, ProfileStore, check_name
from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError


class PreviousProfiles:
    def __init__(self, folder: Path, profiles_dir: Path, store: ProfileStore) -> None:
        """``folder``: where the replaced profiles are kept (data/tune/previous)."""
        self.folder = folder
        self._profiles_dir = profiles_dir
        self._store = store

    def apply(self, profile: Profile) -> Path:
        """Keep the current file of ``profile.name`` (unless one is kept already), then write
        ``profile``. Returns the profile's file."""
        name = check_name(profile.name)
        kept, marker = self.folder / f"{name}.toml", self.folder / f"{name}.preset"
        current = self._profiles_dir / f"{name}.toml"
        if not kept.exists() and not marker.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            if current.exists():
                write_bytes_atomic(kept, current.read_bytes(), mode=0o600)
            else:
                write_bytes_atomic(marker, b"", mode=0o600)
        return self._store.save(profile)

    def undo(self, name: str) -> str:
        """Put back the profile kept by the first apply; ConfigError when none is kept."""
        check_name(name)
        kept, marker = self.folder / f"{name}.toml", self.folder / f"{name}.preset"
        current = self._profiles_dir / f"{name}.toml"
        if kept.exists():
            write_bytes_atomic(current, kept.read_bytes())
            kept.unlink()
            return f"profile {name} is back to what it was before `traylm tune --apply`"
        if marker.exists():
            current.unlink(missing_ok=True)
            marker.unlink()
            return f"profile {name} is the shipped preset again"
        raise ConfigError(
            f"nothing to undo for profile {name!r}: `traylm tune {name} --apply` keeps the "
            "profile it replaces, and it has not replaced one"
        )

    def names(self) -> list[str]:
        """The profiles whose pre-tune version is kept (what `--undo` can put back)."""
        if not self.folder.is_dir():
            return []
        return sorted({p.stem for p in self.folder.iterdir() if p.suffix in (".toml", ".preset")})

    def kept(self, name: str) -> bool:
        return (self.folder / f"{name}.toml").exists() or (self.folder / f"{name}.preset").exists()

    def keep_power(self, name: str, limits: dict[str, int | None]) -> None:
        """Keep the persisted power limits (by GPU UUID, None: none) an apply replaces, unless
        an earlier apply kept some (those are the ones from before tuning)."""
        path = self.folder / f"{check_name(name)}.power.json"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, json.dumps(limits).encode(), mode=0o600)

    def kept_power(self, name: str) -> dict[str, int | None] | None:
        path = self.folder / f"{check_name(name)}.power.json"
        if not path.exists():
            return None
        limits: dict[str, int | None] = json.loads(path.read_text())
        return limits

    def forget_power(self, name: str) -> None:
        (self.folder / f"{check_name(name)}.power.json").unlink(missing_ok=True)

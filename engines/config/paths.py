"""Every path traylm uses (platformdirs). Apart from the settings (engines/config/sections.py, which
gives ``Paths`` too) so that a short command finds the daemon without building the settings'
classes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "traylm"


@dataclass(frozen=True)
class Paths:
    """Where traylm keeps its files. ``TRAYLM_HOME`` puts everything under one folder (tests,
    portable installs); ``TRAYLM_ENVS_DIR`` moves only the engine venvs (CI caches them)."""

    config_dir: Path
    data_dir: Path
    state_dir: Path
    cache_dir: Path
    envs_override: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Paths:
        env = os.environ if environ is None else environ
        envs = Path(env["TRAYLM_ENVS_DIR"]).expanduser() if env.get("TRAYLM_ENVS_DIR") else None
        home = env.get("TRAYLM_HOME")
        if home:
            root = Path(home).expanduser()
            return cls(root / "config", root / "data", root / "state", root / "cache", envs)
        return cls(
            Path(platformdirs.user_config_dir(APP_NAME)),
            Path(platformdirs.user_data_dir(APP_NAME)),
            Path(platformdirs.user_state_dir(APP_NAME)),
            Path(platformdirs.user_cache_dir(APP_NAME)),
            envs,
        )

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def profiles_dir(self) -> Path:
        return self.config_dir / "profiles"

    @property
    def local_models_dir(self) -> Path:
        """Model folders registered in the library (``traylm models add``), one TOML each."""
        return self.config_dir / "models"

    @property
    def envs_dir(self) -> Path:
        return self.envs_override or self.data_dir / "envs"

    @property
    def engine_cache_dir(self) -> Path:
        """Caches engines rebuild when lost (compiled graphs, per env and model)."""
        return self.cache_dir / "engines"

    @property
    def trt_engines_dir(self) -> Path:
        return self.data_dir / "trt-engines"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "traylm.db"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def daemon_json(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def daemon_lock(self) -> Path:
        return self.state_dir / "daemon.lock"

    @property
    def engine_pids_json(self) -> Path:
        return self.state_dir / "engine-pids.json"

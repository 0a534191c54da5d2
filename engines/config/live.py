"""The running daemon's settings: config.toml under the runtime overrides, read once before any
part is built, changed only through ``update``, with one subscription for live changes.

Two layers:

    saved      what config.toml holds (``load`` reads it; ``update`` changes and writes it)
    overrides  ``{"section.field": value}`` given on the command line (``traylm serve --port 8100
               --simulate-gpus 2``): they win over the saved value while this daemon runs and
               are never written to config.toml

``current`` is the saved layer with the overrides applied: what every part uses. A part reads
``current`` when it needs a value, and subscribes when it must act on a change (the gateway
rebuilds its Host and key checks, the thermal guard takes new thresholds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from engines.config.sections import Settings, load_settings, replace_setting, save_settings

log = logging.getLogger(__name__)

SettingsListener = Callable[[Settings], None]
"""Called with the new ``current`` settings after each change, on the daemon's event loop."""


class SettingsView(Protocol):
    """What a part needs to read the settings and hear of changes (tests pass a fake)."""

    @property
    def current(self) -> Settings: ...

    def subscribe(self, listener: SettingsListener) -> None: ...


class SettingsEditor(SettingsView, Protocol):
    """A settings view that may also change them (the control API, the thermal guard page)."""

    async def update(self, changes: Mapping[str, Any]) -> Settings: ...


class LiveSettings:
    """The daemon's settings (see the module docstring). Construct with already-loaded values
    (no I/O); ``load`` reads config.toml."""

    def __init__(
        self,
        saved: Settings,
        *,
        config_file: Path,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Raises ConfigError when an override is not a valid setting."""
        self.config_file = config_file
        self.overrides: dict[str, Any] = dict(overrides or {})
        self._saved = saved
        self._current = _apply(saved, self.overrides)
        self._listeners: list[SettingsListener] = []
        self._lock = asyncio.Lock()

    @classmethod
    def load(cls, config_file: Path, overrides: Mapping[str, Any] | None = None) -> LiveSettings:
        """Read and validate config.toml, then the overrides (blocking: call from a thread).
        Raises ConfigError naming the bad setting."""
        return cls(load_settings(config_file), config_file=config_file, overrides=overrides)

    @property
    def current(self) -> Settings:
        return self._current

    @property
    def saved(self) -> Settings:
        """What config.toml holds (no overrides)."""
        return self._saved

    def subscribe(self, listener: SettingsListener) -> None:
        self._listeners.append(listener)

    async def update(self, changes: Mapping[str, Any]) -> Settings:
        """Apply ``{"section.field": value}`` changes to config.toml's values: all validated,
        saved and applied, or none (the first invalid one raises ConfigError). Overrides stay
        on top and stay out of the file. Returns the new ``current``."""
        async with self._lock:
            saved = self._saved
            for dotted, value in changes.items():
                saved = replace_setting(saved, dotted, value)
            current = _apply(saved, self.overrides)
            await asyncio.to_thread(save_settings, self.config_file, saved)
            self._saved, self._current = saved, current
        for listener in list(self._listeners):
            try:
                listener(current)
            except Exception:  # boundary: one part failing to apply must not stop the others
                log.exception("applying the new settings failed in %r", listener)
        return current


def _apply(settings: Settings, overrides: Mapping[str, Any]) -> Settings:
    for dotted, value in overrides.items():
        settings = replace_setting(settings, dotted, value)
    return settings

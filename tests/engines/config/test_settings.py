"""LiveSettings: config.toml under the runtime overrides, changed only through update(), with one
subscription for live changes; the overrides never reach the file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engines.config.live import LiveSettings
from engines.config.sections import Settings, load_settings
from engines.config.tomlfile import write_toml_atomic
from engines.errors import ConfigError


def test_overrides_win_while_running_and_never_reach_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    write_toml_atomic(config, {"gateway": {"max_queue": 50}})
    live = LiveSettings.load(config, {"gateway.port": 8100, "gpu.simulate_gpus": 2})
    assert (live.current.gateway.port, live.current.gpu.simulate_gpus) == (8100, 2)
    assert live.saved.gateway.port == 8000 and live.current.gateway.max_queue == 50
    heard: list[Settings] = []
    live.subscribe(heard.append)

    async def change() -> Settings:
        return await live.update({"gateway.max_queue": 7, "gateway.port": 8001})

    new = asyncio.run(change())
    assert heard == [new] and new is live.current
    assert (new.gateway.port, new.gpu.simulate_gpus, new.gateway.max_queue) == (8100, 2, 7)
    on_disk = load_settings(config)
    assert (on_disk.gateway.port, on_disk.gpu.simulate_gpus) == (8001, 0)  # the user's, not ours
    assert on_disk.gateway.max_queue == 7
    assert "simulate_gpus" not in config.read_text()


async def test_a_bad_change_applies_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    live = LiveSettings(Settings(), config_file=config)
    heard: list[Settings] = []
    live.subscribe(heard.append)
    before = live.current
    with pytest.raises(ConfigError, match="did you mean"):
        await live.update({"gateway.max_queue": 7, "gateway.prot": 1})
    assert live.current is before and heard == [] and not config.exists()


def test_a_bad_override_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gateway.prot"):
        LiveSettings.load(tmp_path / "config.toml", {"gateway.prot": 8100})

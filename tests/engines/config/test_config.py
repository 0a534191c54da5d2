"""Settings and profiles: defaults, validation messages, atomic writes, presets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engines.config.fields import doc
from engines.config.profiles import Profile, ProfileStore, profile_from_mapping
from engines.config.sections import (
    Paths,
    Settings,
    load_settings,
    replace_setting,
    resources_dir,
    save_settings,
)
from engines.config.tomlfile import write_toml_atomic
from engines.errors import ConfigError, ProfileNotFound


def test_paths_follow_traylm_home_and_envs_override(tmp_path: Path) -> None:
    p = Paths.from_env({"TRAYLM_HOME": str(tmp_path), "TRAYLM_ENVS_DIR": str(tmp_path / "e")})
    assert p.config_file == tmp_path / "config" / "config.toml"
    assert p.daemon_json == tmp_path / "state" / "daemon.json"
    assert p.envs_dir == tmp_path / "e"
    assert p.db_path == tmp_path / "data" / "traylm.db"


def test_missing_settings_file_gives_defaults(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "none.toml")
    assert s == Settings()
    assert s.bind_host == "127.0.0.1" and s.gateway.port == 8000


def test_settings_errors_name_field_value_and_fix(tmp_path: Path) -> None:
    f = tmp_path / "config.toml"
    f.write_text("[gateway]\nprot = 8001\nmax_queue = -1\n[gpuu]\nx = 1\n")
    with pytest.raises(ConfigError) as err:
        load_settings(f)
    msg = err.value.message
    assert "has 3 problems" in msg
    assert "'prot' is not a known field; did you mean 'port'?" in msg
    assert "max_queue = -1: must be at least 0" in msg
    assert "[gpuu] is not a settings section; did you mean 'gpu'?" in msg


def test_a_retired_setting_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A config.toml written when ``gateway.express_lane`` existed still starts the daemon."""
    f = tmp_path / "config.toml"
    f.write_text("[gateway]\nexpress_lane = false\nport = 8123\n")
    s = load_settings(f)
    assert s.gateway.port == 8123
    assert "[gateway] express_lane is no longer a setting" in caplog.text


def test_broken_toml_says_which_file(tmp_path: Path) -> None:
    f = tmp_path / "config.toml"
    f.write_text("[gateway\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(f)


def test_lan_sharing_refused_without_api_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no API key is set"):
        replace_setting(Settings(), "gateway.lan_sharing", True)
    s = replace_setting(Settings(), "gateway.api_key_sha256", ["ab" * 32])
    s = replace_setting(s, "gateway.lan_sharing", True)
    assert s.bind_host == "0.0.0.0"


def test_settings_roundtrip_writes_only_changes(tmp_path: Path) -> None:
    f = tmp_path / "c" / "config.toml"
    s = replace_setting(Settings(), "gateway.port", 8123)
    save_settings(f, s)
    assert f.read_text().strip() == "[gateway]\nport = 8123"
    assert load_settings(f) == s


def test_every_setting_has_a_doc_line() -> None:
    import dataclasses

    from engines.config.sections import SECTIONS

    for section in SECTIONS.values():
        for field in dataclasses.fields(section):
            assert doc(section, field.name), f"{section.__name__}.{field.name} has no doc"
    for field in dataclasses.fields(Profile):
        assert doc(Profile, field.name)


def test_atomic_write_leaves_old_file_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "x.toml"
    write_toml_atomic(f, {"a": 1})

    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_toml_atomic(f, {"a": 2})
    assert f.read_text() == "a = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.toml"]  # no temp file left behind


def test_profile_validation_collects_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        profile_from_mapping(
            "bad name",
            {"model": "", "tensor_parallel_size": 2, "kv_cache_dtype": "fp4", "env": {"1X": "y"}},
        )
    msg = err.value.message
    for part in (
        "1-64 letters",
        "model is required",
        "must be one of auto, fp8",
        "set gpus = [0, 1]",
        "not a valid environment variable",
    ):
        assert part in msg, part


def test_profile_served_names() -> None:
    p = profile_from_mapping("p", {"model": "Qwen/Qwen2.5-7B-Instruct", "aliases": ["q"]})
    assert p.served_names == ("Qwen2.5-7B-Instruct", "q")


def test_presets_load_and_fit_the_dual_4090_rules() -> None:
    store = ProfileStore(Path("/nonexistent"))
    names = store.names()
    assert len(names) >= 3
    for name in names:
        p = store.load(name)
        assert store.is_preset(name)
        assert p.world_size <= len(p.gpus) <= 2
    tp2 = [store.load(n) for n in names if store.load(n).tensor_parallel_size == 2]
    assert tp2 and all(p.gpus == (0, 1) and not p.p2p for p in tp2)


def test_profile_store_save_load_delete(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles", resources_dir() / "profiles")
    p = profile_from_mapping("mine", {"model": "org/m", "max_model_len": 4096})
    store.save(p)
    assert store.load("mine") == p
    assert not store.is_preset("mine")
    with pytest.raises(ProfileNotFound, match="did you mean 'mine'"):
        store.load("mime")
    store.delete("mine")
    with pytest.raises(ProfileNotFound):
        store.load("mine")
    with pytest.raises(ConfigError, match="shipped preset"):
        store.delete("llama-3.1-8b-1gpu")


def test_broken_profile_file_is_reported_not_fatal(tmp_path: Path) -> None:
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "broken.toml").write_text('model = "org/m"\ndtype = "fp64"\n')
    store = ProfileStore(d, resources_dir() / "profiles")
    good, broken = store.load_all()
    assert len(good) >= 3
    assert len(broken) == 1 and "dtype = 'fp64'" in broken[0]

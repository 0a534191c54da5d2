"""The Hugging Face token through the daemon's hub route (GET/PUT/DELETE /api/hub/token): the
daemon owns the login file (hf auth login's, 0600, written whole), says where the token it sends
comes from, and never hands the token back."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from engines.errors import ControlAPIError
from tests.conftest import RunningDaemon


async def test_save_check_and_clear_the_token(
    daemon: RunningDaemon, hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    none = await daemon.client.hf_token()
    assert (none.source, none.sent) == ("", False)
    assert none.path == str(hf_home / "token")

    saved = await daemon.client.set_hf_token("  hf_abcDEF123  \n")
    assert (saved.source, saved.env_var) == ("file", "")
    path = hf_home / "token"
    assert path.read_text() == "hf_abcDEF123"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "hf_abcDEF123" not in repr(saved)  # the token never comes back
    access = await daemon.client.hub_access()
    assert access["token_found"] is True

    monkeypatch.setenv("HF_TOKEN", "hf_fromenv")  # the daemon's environment takes precedence
    from_env = await daemon.client.hf_token()
    assert (from_env.source, from_env.env_var) == ("env", "HF_TOKEN")
    monkeypatch.delenv("HF_TOKEN")

    cleared = await daemon.client.clear_hf_token()
    assert cleared.source == "" and not path.exists()
    assert (await daemon.client.clear_hf_token()).source == ""  # nothing saved: still fine


@pytest.mark.parametrize("bad", ["", "   ", "hf_a\nhf_b", "hf token", "x" * 1001])
async def test_what_cannot_be_a_token_is_refused_and_nothing_is_written(
    daemon: RunningDaemon, hf_home: Path, bad: str
) -> None:
    with pytest.raises(ControlAPIError) as err:
        await daemon.client.set_hf_token(bad)
    assert err.value.http_status == 400
    assert "huggingface.co/settings/tokens" in err.value.message
    assert not (hf_home / "token").exists()
    assert not hf_home.exists() or not any(hf_home.iterdir())  # no temporary file left


async def test_an_unwritable_login_file_is_said_in_words(
    daemon: RunningDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HF_TOKEN_PATH", str(blocker / "token"))  # its folder cannot exist
    with pytest.raises(ControlAPIError, match="cannot save the Hugging Face token"):
        await daemon.client.set_hf_token("hf_abc")
    assert (await daemon.client.hf_token()).path == str(blocker / "token")

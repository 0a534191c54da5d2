"""Names that could escape the cache are refused before any disk access, gated models without
access fail with one clear message, and the Hugging Face token goes only where it is trusted."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from engines.errors import ControlAPIError, InvalidName
from engines.events import DownloadState
from engines.hub.names import validate_filename, validate_repo_id, validate_revision
from engines.hub.verify import ExpectedFile, check_file
from tests.conftest import RunningDaemon
from tests.engines.hub.conftest import cache_repo, wait_download
from tests.fakes.hub_server import FakeHub, bytes_file, tiny_llama_repo

GATED = "traylm-test/gated-llama"
TOKEN = "hf_test_token"


@pytest.mark.parametrize(
    "repo_id",
    [
        "../etc",
        "org/../name",
        "org/..",
        "/abs/name",
        "org/name/extra",
        "org--x/name",
        "org/na--me",
        "C:/name",
        "\\\\server\\share",
        "org/name\x00",
        "org/näme",
        "",
        "org/-name",
    ],
)
def test_bad_repo_ids_are_refused(repo_id: str) -> None:
    with pytest.raises(InvalidName):
        validate_repo_id(repo_id)


@pytest.mark.parametrize(
    "filename",
    [
        "../config.json",
        "a/../../b",
        "/etc/passwd",
        "C:\\x.json",
        "C:/x.json",
        "\\\\host\\share\\x",
        "a//b",
        "./a",
        "a\x00b",
        "",
    ],
)
def test_traversal_file_names_are_refused(filename: str) -> None:
    with pytest.raises(InvalidName):
        validate_filename(filename)


def test_good_names_pass() -> None:
    assert validate_repo_id("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert validate_filename("original/params.json") == "original/params.json"
    assert validate_revision("refs/pr/1") == "refs/pr/1"
    with pytest.raises(InvalidName):
        validate_revision("../../main")


def test_verification_never_reads_outside_the_snapshot(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("x")
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    with pytest.raises(InvalidName):
        check_file(snapshot, ExpectedFile("../secret", 1, None, "0" * 40))


async def _status(d: RunningDaemon, method: str, path: str, body: object = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {d.daemon.token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, aiohttp.client.URL(d.url + path, encoded=True), json=body, headers=headers
        ) as resp,
    ):
        data = await resp.json(content_type=None)
        return resp.status, json.dumps(data)


async def test_traversal_through_the_api_is_refused_before_touching_disk(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    attempts = [
        ("POST", "/api/downloads", {"repo_id": "../../etc"}),
        ("POST", "/api/downloads", {"repo_id": "org--x/name"}),
        ("POST", "/api/downloads", {"repo_id": "traylm-test/tiny-llama", "revision": "../x"}),
        ("GET", "/api/models/org/..%2f..%2fetc", None),
        ("GET", "/api/models/../../etc/passwd", None),
        ("DELETE", "/api/models/org/a--b", None),
        ("POST", "/api/models/org%2f..%2f../x/verify", None),
    ]
    for method, path, body in attempts:
        status, text = await _status(hub_daemon, method, path, body)
        assert status in (400, 403, 404), (path, status, text)
        assert status != 404 or "not canonical" in text or "invalid_name" in text, text
    assert not (hf_home / "hub").exists(), "nothing was written to the cache"
    assert not any("etc" in r.path for r in fake_hub.requests), "nothing reached the Hub"


async def test_a_malicious_repo_listing_with_traversal_names_is_refused(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path, tmp_path: Path
) -> None:
    evil = "../../../../evil.json"
    repo = tiny_llama_repo("traylm-test/evil", extra={evil: bytes_file(evil, b"{}")})
    fake_hub.add_repo(repo)
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.pull("traylm-test/evil")
    assert err.value.code == "invalid_name" and err.value.http_status == 400
    assert "path traversal" in err.value.message
    assert not (hf_home / "hub").exists()
    assert not list(tmp_path.rglob("evil.json"))


async def test_a_gated_model_without_a_token_fails_with_what_to_do(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    fake_hub.add_repo(tiny_llama_repo(GATED, gated="manual"))
    details = await hub_daemon.client.model_details(GATED)
    assert details.gated == "manual"
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.pull(GATED)
    assert err.value.code == "gated" and err.value.http_status == 403
    assert "hf auth login" in err.value.message
    assert not cache_repo(hf_home, GATED).exists()


async def test_a_token_is_not_sent_to_an_endpoint_that_is_not_trusted(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    fake_hub.add_repo(tiny_llama_repo(GATED, gated="manual"))
    access = await hub_daemon.client.hub_access()
    assert access["token_found"] and not access["token_sent"]
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.pull(GATED)
    assert "not sent" in err.value.message and "hub.trusted_endpoints" in err.value.message
    assert not any(r.auth for r in fake_hub.requests), "the token never left traylm"


async def test_a_trusted_endpoint_gets_the_token_but_the_cdn_never_does(
    hub_daemon_factory, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    d = await hub_daemon_factory(trusted_endpoints=(fake_hub.url,))
    fake_hub.add_repo(tiny_llama_repo(GATED, gated="manual"))
    status = await d.client.pull(GATED)
    final = await wait_download(d, status.id, (DownloadState.READY, DownloadState.FAILED))
    assert final.state == DownloadState.READY, final.message
    resolves = [r for r in fake_hub.requests if "/resolve/" in r.path]
    cdn = [r for r in fake_hub.requests if r.path.startswith("/cdn/")]
    assert resolves and all(r.auth for r in resolves)
    assert cdn and not any(r.auth for r in cdn), "the token is not sent to the CDN host"


async def test_a_token_without_access_fails_with_what_to_do(
    hub_daemon_factory, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    fake_hub.tokens["hf_other"] = {"someone/else"}
    d = await hub_daemon_factory(trusted_endpoints=(fake_hub.url,))
    fake_hub.add_repo(tiny_llama_repo(GATED, gated="manual"))
    status = await d.client.pull(GATED)
    final = await wait_download(d, status.id, (DownloadState.READY, DownloadState.FAILED))
    assert final.state == DownloadState.FAILED and final.error_code == "gated"
    assert "no access" in final.message and final.attempts == 1
    assert all(
        m.repo_id != GATED or m.verified != "verified" for m in await d.client.local_models()
    )


async def test_trust_remote_code_needs_consent_for_that_model(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, fake_env: Path
) -> None:
    """The engine is the FAKE vLLM env; the check happens before any process starts."""
    hub_daemon.write_profile(
        "custom", model="traylm-test/tiny-llama", device="cpu", trust_remote_code=True
    )
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.start("custom")
    assert "traylm models trust traylm-test/tiny-llama" in err.value.message
    assert await hub_daemon.client.engines() == []
    await hub_daemon.client.trust_model("traylm-test/tiny-llama", True)
    status = await hub_daemon.client.start("custom")
    assert status.engine_id == "custom"
    await hub_daemon.client.stop("custom")


def test_token_sources_and_the_trust_rule(tmp_path: Path) -> None:
    from engines.config.sections import HubSettings
    from engines.hub.access import OFFICIAL_ENDPOINT, resolve_access

    (tmp_path / "token").write_text("hf_saved\n")
    saved = {"HF_HOME": str(tmp_path)}
    official = resolve_access(HubSettings(), saved)
    assert official.endpoint == OFFICIAL_ENDPOINT and official.token == "hf_saved"
    assert official.cache_dir == tmp_path / "hub" and official.official

    env_token = resolve_access(HubSettings(), {**saved, "HF_TOKEN": "hf_env"})
    assert env_token.token == "hf_env"
    custom = resolve_access(HubSettings(token_env="MY_TOKEN"), {**saved, "MY_TOKEN": "hf_mine"})
    assert custom.token == "hf_mine"

    mirror = {**saved, "HF_ENDPOINT": "https://mirror.example/"}
    withheld = resolve_access(HubSettings(), mirror)
    assert withheld.endpoint == "https://mirror.example"
    assert withheld.token is None and withheld.token_found and withheld.hf_token_arg is False
    assert "not the official Hub" in withheld.gated_advice("org/m")
    env = withheld.worker_env({"HF_TOKEN": "hf_env", "PATH": "/bin"}, read_timeout_s=20)
    assert "HF_TOKEN" not in env and env["HF_ENDPOINT"] == "https://mirror.example"

    trusted = resolve_access(HubSettings(trusted_endpoints=("https://mirror.example:443",)), mirror)
    assert trusted.token == "hf_saved" and trusted.token_withheld_reason == ""

    with pytest.raises(Exception, match="not an http"):
        resolve_access(HubSettings(endpoint="file:///etc"), saved)

"""The chat's MCP server list: the mcpServers format of Claude Desktop and LM Studio, read and
imported into traylm's config dir (private), with clear errors and nothing half-written."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from desktop.chat.mcp_config import config_path, import_file, load_servers, parse_servers
from engines.config.sections import Paths
from engines.errors import ConfigError

CLAUDE_DESKTOP = {
    "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-files", "/tmp"], "env": {"T": "1"}},
        "web": {"url": "http://127.0.0.1:9000/mcp"},
    }
}


def test_both_transports_parse() -> None:
    files, web = parse_servers(json.dumps(CLAUDE_DESKTOP), "x.json")
    assert (files.name, files.command, files.args, dict(files.env)) == (
        "files", "npx", ("-y", "server-files", "/tmp"), {"T": "1"},
    )  # fmt: skip
    assert files.transport == "stdio"
    assert (web.name, web.url, web.transport) == ("web", "http://127.0.0.1:9000/mcp", "http")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("{not json", "not valid JSON"),
        ('{"servers": {}}', '"mcpServers"'),
        ('{"mcpServers": {"a": {}}}', 'exactly one of "command"'),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://y"}}}', "exactly one"),
        ('{"mcpServers": {"a": {"url": "file:///etc"}}}', "http://"),
        ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', "args must be a list"),
        ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', "env must be an object"),
    ],
)
def test_bad_files_say_what_to_write(doc: str, says: str) -> None:
    with pytest.raises(ConfigError, match="x.json") as err:
        parse_servers(doc, "x.json")
    assert says in err.value.message


def test_import_merges_into_a_private_file(paths: Paths, tmp_path: Path) -> None:
    assert load_servers(paths) == ()
    source = tmp_path / "claude_desktop_config.json"
    source.write_text(json.dumps(CLAUDE_DESKTOP))
    import_file(paths, source)
    other = tmp_path / "lmstudio-mcp.json"
    other.write_text(json.dumps({"mcpServers": {"web": {"url": "https://example.org/mcp"}}}))
    servers = import_file(paths, other)
    assert [(s.name, s.url) for s in servers] == [("files", ""), ("web", "https://example.org/mcp")]
    assert load_servers(paths) == servers
    assert stat.S_IMODE(config_path(paths).stat().st_mode) == 0o600


def test_a_bad_import_changes_nothing(paths: Paths, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(CLAUDE_DESKTOP))
    import_file(paths, good)
    before = config_path(paths).read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {"x": {"command": 3}}}')
    with pytest.raises(ConfigError, match="command and url must be text"):
        import_file(paths, bad)
    with pytest.raises(ConfigError, match="cannot read"):
        import_file(paths, tmp_path / "missing.json")
    assert config_path(paths).read_bytes() == before

"""The chat's MCP servers, in the ``mcpServers`` JSON format Claude Desktop and LM Studio use:

    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "server-files"], "env": {}},
                    "web": {"url": "http://127.0.0.1:9000/mcp"}}}

A server with ``command`` runs as a child process over stdio; one with ``url`` is reached over
streamable HTTP. The file is ``mcp.json`` in traylm's config dir, private to the user (mode
0600): an ``env`` may hold a server's own token. Bad input raises ``ConfigError`` naming the
field and what to write instead; nothing is written then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from engines.config.sections import Paths
from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError

MCP_FILE = "mcp.json"
MAX_FILE_BYTES = 1_000_000


@dataclass(frozen=True)
class MCPServerConfig:
    """One configured server: a command to run (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """What the server's environment gets beyond a minimal PATH and HOME (nothing of traylm's)."""
    url: str = ""

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    def to_json(self) -> dict[str, object]:
        if self.url:
            return {"url": self.url}
        out: dict[str, object] = {"command": self.command, "args": list(self.args)}
        if self.env:
            out["env"] = dict(self.env)
        return out


def config_path(paths: Paths) -> Path:
    return paths.config_dir / MCP_FILE


def parse_servers(text: str, where: str) -> tuple[MCPServerConfig, ...]:
    """The servers of an ``mcpServers`` document (``where`` names it in errors)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid JSON ({exc}); fix it") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("mcpServers"), Mapping):
        raise ConfigError(
            f'{where} has no "mcpServers" object; write {{"mcpServers": {{"name": '
            '{"command": "...", "args": [...]}}} (the format of Claude Desktop and LM Studio)'
        )
    return tuple(_server(str(name), raw, where) for name, raw in data["mcpServers"].items())


def _server(name: str, raw: object, where: str) -> MCPServerConfig:
    at = f"{where}: mcpServers.{name}"
    if not name.strip():
        raise ConfigError(f"{where}: a server in mcpServers has an empty name; give it one")
    if not isinstance(raw, Mapping):
        raise ConfigError(f'{at} must be an object with "command" or "url"')
    command, url = raw.get("command", ""), raw.get("url", "")
    if not isinstance(command, str) or not isinstance(url, str):
        raise ConfigError(f"{at}: command and url must be text")
    if bool(command.strip()) == bool(url.strip()):
        raise ConfigError(f'{at} needs exactly one of "command" (a program) or "url" (http://)')
    if url and urlparse(url).scheme not in ("http", "https"):
        raise ConfigError(f"{at}.url must start with http:// or https://, not {url!r}")
    args, env = raw.get("args", []), raw.get("env", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f'{at}.args must be a list of text, like ["-y", "server"]')
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError(f'{at}.env must be an object of text, like {{"TOKEN": "..."}}')
    return MCPServerConfig(name, command.strip(), tuple(args), dict(env), url.strip())


def load_servers(paths: Paths) -> tuple[MCPServerConfig, ...]:
    """The configured servers; none when the file does not exist. Blocking (reads a file)."""
    path = config_path(paths)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror}); check its permissions") from None
    return parse_servers(text, str(path))


def save_servers(paths: Paths, servers: tuple[MCPServerConfig, ...]) -> None:
    doc = {"mcpServers": {s.name: s.to_json() for s in servers}}
    text = json.dumps(doc, indent=2) + "\n"
    write_bytes_atomic(config_path(paths), text.encode(), mode=0o600)


def import_file(paths: Paths, source: Path) -> tuple[MCPServerConfig, ...]:
    """Add the servers of another app's file (Claude Desktop's ``claude_desktop_config.json``,
    LM Studio's ``mcp.json``) to traylm's; a server of the same name is replaced. Returns all
    servers now configured. All or nothing: a bad file changes nothing."""
    try:
        if source.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{source} is larger than 1 MB; that is not an mcpServers file")
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {source} ({exc.strerror}); pick another file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source} is not a text file; pick a .json file") from None
    imported = parse_servers(text, str(source))
    if not imported:
        raise ConfigError(f"{source} lists no servers in mcpServers; nothing was imported")
    names = {s.name for s in imported}
    kept = tuple(s for s in load_servers(paths) if s.name not in names)
    servers = kept + imported
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    save_servers(paths, servers)
    return servers

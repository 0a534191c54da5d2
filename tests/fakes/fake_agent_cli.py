"""A FAKE agent CLI (stand-in for Claude Code, Codex or opencode, which the quick suite does
not install): installed as ``claude``, ``codex`` or ``opencode`` on a PATH folder, it records
its argv and environment as JSON to $FAKE_AGENT_RECORD, with $FAKE_AGENT_ASK sends that
prompt as one Messages request (as Claude Code would), writes a line to stdout and one to
stderr, and exits with $FAKE_AGENT_EXIT (0 by default) or, with $FAKE_AGENT_WAIT, waits for a
signal and exits 128 + its number."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

_BODY = """\
import json, os, signal, sys
def record():
    with open(os.environ["FAKE_AGENT_RECORD"], "w") as fh:
        json.dump({"argv": sys.argv, "env": dict(os.environ)}, fh)
record()
if os.environ.get("FAKE_AGENT_ASK"):  # one Messages request, as Claude Code sends it
    import urllib.request
    body = {"model": os.environ["ANTHROPIC_MODEL"], "max_tokens": 8,
            "messages": [{"role": "user", "content": os.environ["FAKE_AGENT_ASK"]}]}
    ask = urllib.request.Request(
        os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["ANTHROPIC_AUTH_TOKEN"],
                 "Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(ask, timeout=60) as reply:
        print("fake agent got", reply.status)
print("fake agent says hi")
print("fake agent note", file=sys.stderr)
sys.stdout.flush()
if os.environ.get("FAKE_AGENT_WAIT"):
    got = []
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda n, _f: got.append(n))
    open(os.environ["FAKE_AGENT_WAIT"], "w").close()
    while not got:
        signal.pause()
    sys.exit(128 + got[0])
sys.exit(int(os.environ.get("FAKE_AGENT_EXIT", "0")))
"""
SCRIPT = f"#!{sys.executable}\n{_BODY}"


def install_fake_agent(bin_dir: Path, name: str) -> Path:
    """The FAKE agent as ``bin_dir/name`` (executable)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(SCRIPT)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def recorded(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data

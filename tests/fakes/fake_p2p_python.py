"""FAKE engine-env python for the doctor's P2P copy check: no two GPUs here, so this stands in
for ``ENV/bin/python -c P2P_SCRIPT A B MIB``. ``make_fake_python`` writes an executable that
acts out one outcome: a good copy, changed data, a hung copy, a crash, or garbage."""

from __future__ import annotations

import sys
from pathlib import Path

BEHAVIOUR = {
    "ok": "say(peer=True, bytes=int(sys.argv[-1]) << 20, seconds=0.01, match=True)",
    "host": "say(peer=False, bytes=int(sys.argv[-1]) << 20, seconds=0.05, match=True)",
    "changed": "say(peer=True, bytes=int(sys.argv[-1]) << 20, seconds=0.01, match=False)",
    "hang": "time.sleep(600)",
    "crash": 'sys.stderr.write("RuntimeError: CUDA error: an illegal memory access\\n"); '
    "sys.exit(1)",
    "garbage": 'print("TRAYLM_P2P {not json")',
}


def make_fake_python(folder: Path, behaviour: str) -> Path:
    """An executable at ``folder/bin/python`` that records its argv and acts ``behaviour``."""
    python = folder / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, time\n"
        f"open({str(folder / 'argv.json')!r}, 'w').write(json.dumps(sys.argv))\n"
        "def say(**facts):\n"
        "    print('TRAYLM_P2P ' + json.dumps(facts), flush=True)\n"
        f"{BEHAVIOUR[behaviour]}\n"
    )
    python.chmod(0o755)
    return python

"""The headless core stays headless: importing every engines module loads no Qt (the rule in
STYLE.md; import-linter checks the static imports, this checks what really gets loaded)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import engines
for mod in pkgutil.walk_packages(engines.__path__, "engines."):
    if mod.name.endswith("__main__"):
        continue
    importlib.import_module(mod.name)
qt = sorted(m for m in sys.modules if m.split(".")[0] in ("PySide6", "shiboken6", "qasync", "desktop"))
print(len(sys.modules), qt)
"""


def test_importing_all_of_engines_loads_no_qt() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120
    )
    count, qt = out.stdout.strip().split(" ", 1)
    assert int(count) > 100  # the walk really imported the package
    assert qt == "[]", f"engines pulled in Qt/desktop modules: {qt}"


HELPER_CODE = """
import sys
import engines.gpu.helperd
print(" ".join(sorted(m for m in sys.modules if m.startswith("engines."))))
"""


def test_the_root_helper_loads_only_gpu_event_types() -> None:
    """traylm-gpud runs as root: it loads the GPU event types and the shared codec, and none of
    the other features' types (bench, chat, hub, TensorRT, remote) nor the daemon's parts."""
    out = subprocess.run(
        [sys.executable, "-c", HELPER_CODE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(out.stdout.split())
    assert {"engines.events.gpu", "engines.events.codec", "engines.gpu.helperd"} <= loaded
    others = {f"engines.events.{m}" for m in ("bench", "chat", "hub", "trt", "remote", "registry")}
    assert not loaded & others, f"traylm-gpud loaded {sorted(loaded & others)}"
    assert not loaded & {"engines.daemon", "engines.supervisor", "engines.gateway.app"}

"""What the designed look costs: time to apply the theme, to polish the tray menu, and to build
and show the dashboard window, with the theme and without (Qt's plain Fusion), each in a fresh
process (offscreen), alternating, medians of N runs.

    .venv/bin/python tests/perf/theme_bench.py [--runs 9]

Prints figures and the ratio themed/plain; asserts nothing (tests/ never asserts on wall-clock
time). The start of the tray app (tests/perf/desktop_bench.py) pays the theme and the menu's
polish; the dashboard is built on first open.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os, sys, tempfile, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
os.environ["TRAYLM_HOME"] = tempfile.mkdtemp(prefix="traylm-theme-bench-")
sys.path.insert(0, sys.argv[2])
from PySide6.QtWidgets import QApplication, QMenu
from desktop.app import DesktopApp
from desktop.look.theme import apply_theme
from engines.config.sections import Paths

app = QApplication([])
t0 = time.perf_counter()
if sys.argv[1] == "theme":
    apply_theme(app, "light")
t1 = time.perf_counter()
desktop = DesktopApp(Paths.from_env(), spawn_daemon=False, offer_setup=False)
menu = desktop.tray.menu  # start() is not called: no daemon, and no theme unless applied above
menu.ensurePolished()
menu.adjustSize()
t2 = time.perf_counter()
dash = desktop.open_dashboard("engines")
app.processEvents()
t3 = time.perf_counter()
print(json.dumps({"theme": t1 - t0, "menu": t2 - t1, "dashboard": t3 - t2}))
desktop.shutdown()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=9)
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"plain": [], "theme": []}
    for _ in range(args.runs):
        for mode in results:
            out = subprocess.run(
                [sys.executable, "-c", PROBE, mode, str(ROOT)],
                capture_output=True, text=True, check=True, timeout=120,
            )  # fmt: skip
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for key, label in (("theme", "apply the theme"), ("menu", "tray menu built and polished"),
                       ("dashboard", "dashboard (Engines page) built and shown")):  # fmt: skip
        plain = statistics.median(r[key] for r in results["plain"]) * 1000
        themed = statistics.median(r[key] for r in results["theme"]) * 1000
        ratio = f"{themed / plain:.2f}×" if plain > 0.05 else "-"
        print(f"{label:<44} plain {plain:7.1f} ms   themed {themed:7.1f} ms   {ratio}")


if __name__ == "__main__":
    main()

"""How fast the ``traylm`` command answers (prints figures; asserts nothing about time).

    python tests/perf/cli_start.py [--runs 7]

Wall time of whole commands as a user runs them (``python -m engines ...``, a fresh process
each time), median of ``--runs``, next to a bare Python start (``python -c pass``) in the same
interleaved rounds, so a loaded machine shifts both alike: ``traylm ps`` and ``traylm status``
with no daemon running (they say so) and against a real ``traylm serve`` (no engine) in a
private TRAYLM_HOME. Target: a command that talks to the daemon within 0.15 s where a bare
start takes 0.03 s (5 x). CPU time (user + system) is shown too: a loaded machine stretches
wall time much more than CPU time. Then ``python -X importtime`` of ``traylm ps``: the ten slowest
imports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.core.procs import free_loopback_port

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "traylm --version": ["-m", "engines", "--version"],
    "traylm ps": ["-m", "engines", "ps"],
    "traylm status": ["-m", "engines", "status"],
}


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall_s, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def rounds(env: dict[str, str], runs: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds per command."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(runs):  # interleaved: a burst of load hits every command alike
        for name, args in COMMANDS.items():
            times[name].append(timed(args, env))
    return {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    }


def show(title: str, medians: dict[str, tuple[float, float]]) -> None:
    bare_wall, bare_cpu = medians["python -c pass"]
    print(title)
    for name, (wall_s, cpu_s) in medians.items():
        print(
            f"  {name:<18} {wall_s:6.3f} s  {wall_s / bare_wall:5.1f} x a bare Python start   "
            f"CPU {cpu_s:6.3f} s  {cpu_s / bare_cpu:5.1f} x"
        )


def slowest_imports(env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "engines", "ps"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    rows = []
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit():
                rows.append((int(cumulative), name.rstrip()))
    print("slowest imports of `traylm ps` (cumulative, one run):")
    for us, name in sorted(rows, reverse=True)[:10]:
        print(f"  {us / 1000:7.1f} ms {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7)
    runs = p.parse_args().runs
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "TRAYLM_HOME": home, "TRAYLM_ENVS_DIR": f"{home}/envs"}
        show(f"no daemon running (median of {runs}):", rounds(env, runs))
        port = free_loopback_port()
        log = Path(home) / "serve.log"
        with log.open("w") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "engines", "serve", "--port", str(port)],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            daemon_json = Path(home) / "state" / "daemon.json"
            deadline = time.monotonic() + 60
            while not daemon_json.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not start:\n{log.read_text()}")
                time.sleep(0.1)
            json.loads(daemon_json.read_text())  # complete
            show(f"against a running daemon (median of {runs}):", rounds(env, runs))
            slowest_imports(env)
        finally:
            daemon.terminate()
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


if __name__ == "__main__":
    main()

"""Real-GPU measurement of the efficiency profiles (needs NVIDIA GPUs, traylm-gpud and a running
`traylm serve`): `traylm bench run --profiles quiet,eco,max` against a model you name. NOT RUN on
the project's CI machine (no GPU there): every profile figure there (tokens/s, TTFT, J/token,
peak temperature, peak fan speed per profile) comes from simulated GPUs and the FAKE engine, so
what a profile really does to a card is known only from this script.

    python tests/gpu/bench_profiles.py MODEL [--profiles quiet,eco,max] [--repeat 2]
        [--requests 64] [--concurrency 1] [--output-len 256] [--allow-simulated]

MODEL is a served model name (`traylm status`; a model on demand is loaded first). It reads the
GPUs and the profile in force, runs the bench (its progress on stderr), prints the table, then
exits 1 if the GPUs are simulated (unless --allow-simulated: a dry run of this script), a
profile has no row, a row lacks J/token or the peak temperature (a real card has both), or the
profile or a GPU's enforced power limit afterwards is not what it was before. Besides the bench
itself it only reads; the bench puts back the profile that was in force (max, the card's
defaults, when there was none). Takes about profiles x repeat x one run of the workload.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.bench import profiles
from engines.events import BenchRun, from_plain

TRAYLM = (sys.executable, "-m", "engines")


def traylm_json(*args: str) -> Any:
    out = subprocess.run([*TRAYLM, *args, "--json"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"`traylm {' '.join(args)}` failed: {out.stderr.strip() or out.stdout}")
    return json.loads(out.stdout)


def limits(overview: dict[str, Any]) -> list[int | None]:
    return [(g.get("snapshot") or {}).get("power_limit_mw") for g in overview["gpus"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a served model name (`traylm status`)")
    p.add_argument("--profiles", default="quiet,eco,max")
    p.add_argument("--repeat", type=int, default=2, help="runs of each profile (2: noise band)")
    p.add_argument("--requests", type=int, default=64, help="measured requests per run")
    p.add_argument("--concurrency", default="1")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument(
        "--allow-simulated",
        action="store_true",
        help="run against a daemon on simulated GPUs (checks this script, measures nothing)",
    )
    args = p.parse_args()

    before = traylm_json("gpus")
    if not before["gpus"]:
        print(f"no GPU: {before.get('message') or 'the daemon sees none'}", file=sys.stderr)
        return 1
    if before["simulated"] and not args.allow_simulated:
        print(
            "the daemon runs on simulated GPUs: start `traylm serve` without --simulate-gpus "
            "on an NVIDIA machine (or pass --allow-simulated to check the script only)",
            file=sys.stderr,
        )
        return 1
    for g in before["gpus"]:
        info = g["info"]
        print(f"GPU {info['index']}: {info['name']}, driver {info.get('driver_version') or '?'}")
    print(f"profile in force: {before.get('profile') or 'none'}; power limits {limits(before)}")

    cmd = ["bench", "run", "--model", args.model, "--profiles", args.profiles]
    cmd += ["--repeat", str(args.repeat), "--requests", str(args.requests)]
    cmd += ["--concurrency", args.concurrency, "--output-len", str(args.output_len), "--json"]
    ran = subprocess.run([*TRAYLM, *cmd], stdout=subprocess.PIPE, text=True, check=False)
    if not ran.stdout.strip():
        print(f"`traylm {' '.join(cmd)}` printed no result (exit {ran.returncode})")
        return 1
    data = json.loads(ran.stdout)
    runs = [
        profiles.ProfileRun(r["profile"], r["round"], from_plain(BenchRun, traylm_json(
            "bench", "show", str(r["run_id"]))))
        for r in data["runs"]
    ]  # fmt: skip
    names = profiles.parse_profiles(args.profiles)
    table = profiles.rows(runs, names)
    print(profiles.format_table(table, runs, args.repeat))

    after = traylm_json("gpus")
    for _ in range(5):  # the limits put back show in the next samples
        if not before.get("profile") or limits(after) == limits(before):
            break
        time.sleep(1.0)
        after = traylm_json("gpus")
    problems = []
    if ran.returncode != 0:
        problems.append(f"`traylm bench run --profiles` exited {ran.returncode}")
    if data["simulated"] and not args.allow_simulated:
        problems.append("the figures are from simulated GPUs")
    for name in names:
        mine = [r for r in table if r.profile == name]
        if not mine:
            problems.append(f"profile {name}: no row (its runs did not finish)")
        for r in mine:
            missing = {"joules_per_token", "temperature_peak_c"} - set(r.figures)
            if missing and not data["simulated"]:
                problems.append(f"profile {name}: no {', '.join(sorted(missing))}")
    if after.get("profile") != (before.get("profile") or profiles.FALLBACK):
        problems.append(
            f"profile afterwards {after.get('profile')}, before {before.get('profile')}"
        )
    if before.get("profile") and limits(after) != limits(before):
        problems.append(f"power limits afterwards {limits(after)}, before {limits(before)}")
    for line in problems:
        print(f"PROBLEM: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

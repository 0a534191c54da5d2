"""Real-GPU check of `traylm tune` (needs NVIDIA GPUs, the CUDA vLLM env and a running
`traylm serve`). NOT RUN on the project's CI machine (no GPU there): the GPU-only candidates
(KV cache fp8, tensor parallel 2, the GPU power limit at 70 % and 85 %, EAGLE-3 where its draft
is cached, other installed engines) and the power/temperature/J-per-token figures are built
against the simulated GPUs and the FAKE engine until someone runs this. The power candidates
need traylm-gpud (`sudo bash installers/linux/install-gpud.sh`).

    python tests/gpu/tune_gpu.py PROFILE [--preset chat] [--budget 30m]

PROFILE is a vLLM profile on CUDA. It runs `traylm tune PROFILE --json` (no --apply), prints the
table, and exits 1 if a GPU-only candidate this machine should have was neither measured nor
said why it was left out, if a measured candidate lacks the GPU figures, if an engine of the
tune is still running afterwards, or if a GPU's enforced power limit is not what it was before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.config.sections import Paths


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("profile")
    p.add_argument("--preset", default="chat")
    p.add_argument("--budget", default="30m")
    args = p.parse_args()
    info = json.loads(Paths.from_env().daemon_json.read_text())
    headers = {"Authorization": f"Bearer {info['token']}"}
    gpus = httpx.get(f"{info['url']}/api/gpus", headers=headers, timeout=10).json()
    count = len(gpus) if isinstance(gpus, list) else len(gpus.get("gpus", []))

    def limits() -> list[int | None]:
        return [httpx.get(f"{info['url']}/api/gpus/{i}/power", headers=headers, timeout=10)
                .json().get("enforced_mw") for i in range(count)]  # fmt: skip

    before = limits()
    cmd = [sys.executable, "-m", "engines", "tune", args.profile, "--preset", args.preset,
           "--budget", args.budget]  # fmt: skip
    subprocess.run(cmd, check=False)  # the table, as a user sees it
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=False)
    job = json.loads(out.stdout)
    problems = []
    expected = {"kv-fp8", "power-70", "power-85", "eagle3-spec"} | (
        {"tp-2"} if count >= 2 else set()
    )
    said = {r["key"] for r in job["rows"]} | {d.split(":")[0] for d in job["dropped"]}
    labels = {"kv-fp8": "KV cache in fp8", "tp-2": "tensor parallel on 2 GPUs",
              "power-70": "power limit 70 %", "power-85": "power limit 85 %",
              "eagle3-spec": "EAGLE-3"}  # fmt: skip
    for key in expected:
        if key not in said and labels[key] not in said:
            problems.append(f"{key} was neither measured nor said to be left out")
    for row in job["rows"]:
        if row["runs"] and not {"power_mean_w", "joules_per_token"} <= set(row["figures"]):
            problems.append(f"{row['key']} has no GPU energy figures")
    engines = httpx.get(f"{info['url']}/api/engines", headers=headers, timeout=10).json()
    if any(e["engine_id"].startswith("tune-") and e["state"] != "stopped" for e in engines):
        problems.append("a tune engine is still running")
    if limits() != before:
        problems.append(f"the power limits were {before} mW before the tune, {limits()} after")
    print(f"{count} GPU(s); state {job['state']}; {job['recommendation']}")
    for line in problems:
        print("PROBLEM:", line)
    return 1 if problems or job["state"] != "done" else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Real two-box check of one model across boxes (issue 24, item 3): vLLM multi-node, tensor
# parallel inside each box, pipeline parallel across, on two paired traylm boxes with NVIDIA
# GPUs on one private network. Run it on the HEAD box, with traylm serving on both boxes, the
# same vLLM version installed on both (`traylm engines install vllm`) and the model at the same
# path (or the same repo id downloaded) on both. It pairs the boxes if they are not yet paired
# (it asks you to run `traylm pair` on the other box and type the code), saves a profile with
# `boxes`, runs the preflight, starts the model, times one chat through :8000, kills the
# follower's rank and checks that both ranks come back, then stops the model.
#
#   OTHER=box-b OTHER_ADDRESS=192.168.10.2 MODEL=Qwen/Qwen2.5-7B-Instruct TP=2 \
#     tests/gpu/two_box_spread.sh
#
# Environment: OTHER (the other box's traylm name), OTHER_ADDRESS (its address on the shared
# network, for pairing), MODEL (repo id or folder, on both boxes), TP (GPUs per box, default
# 1), PROFILE (default spread-check), SSH (optional `ssh box-b` prefix to kill the follower rank;
# without it the script asks you to kill it). Exit code 0 means every step passed.
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${OTHER:?name of the other box (traylm peers)}"
: "${MODEL:?model repo id or folder, the same on both boxes}"
TP=${TP:-1}
PROFILE=${PROFILE:-spread-check}
TRAYLM=${TRAYLM:-.venv/bin/traylm}
PY=${PYTHON:-.venv/bin/python}
step() { printf '\n== %s\n' "$*"; }

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs NVIDIA GPUs"; exit 2; }
if ! "$TRAYLM" peers --json | "$PY" -c "import json,sys; sys.exit(0 if any(p['name']=='$OTHER' for p in json.load(sys.stdin)['peers']) else 1)"; then
  : "${OTHER_ADDRESS:?not paired yet: set OTHER_ADDRESS to pair}"
  step "pairing: run \`traylm pair\` on $OTHER and type its code here"
  read -r -p "code: " CODE
  "$TRAYLM" pair "$OTHER_ADDRESS" "$CODE"
fi

step "profile $PROFILE: $MODEL, TP $TP per box, PP 2 across this box and $OTHER"
"$PY" - "$PROFILE" "$MODEL" "$TP" "$OTHER" <<'PYEOF'
import asyncio, sys
from engines.client import DaemonClient
name, model, tp, other = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
async def main():
    async with await DaemonClient.connect() as c:
        saved = await c.save_profile(name, {"model": model, "device": "cuda", "gpus": "auto",
            "tensor_parallel_size": tp, "pipeline_parallel_size": 2, "boxes": [other]})
        for w in saved["warnings"]:
            print("warning:", w)
asyncio.run(main())
PYEOF

step "preflight"
"$TRAYLM" spread check "$PROFILE"

step "start (both ranks)"
start=$(date +%s.%N)
"$TRAYLM" start "$PROFILE" --wait
echo "ready in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f s", b-a}')"

URL=$("$TRAYLM" status --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["url"])')

chat() {
  "$PY" - "$1" "$URL" <<'PYEOF'
import sys, time, openai
c = openai.OpenAI(base_url=sys.argv[2] + "/v1", api_key="none")
t = time.monotonic(); n = 0; first = None
for e in c.chat.completions.create(model=sys.argv[1], stream=True, max_tokens=256,
        messages=[{"role": "user", "content": "Write a short story about two computers."}]):
    if e.choices and e.choices[0].delta.content:
        n += 1; first = first or time.monotonic() - t
d = time.monotonic() - t
print(f"{n} chunks, TTFT {first:.2f} s, {n / d:.1f} chunks/s over {d:.1f} s")
PYEOF
}
SERVED=$("$TRAYLM" status --json | "$PY" -c "import json,sys; print(next(e['served_names'][0] for e in json.load(sys.stdin)['engines'] if e['engine_id']=='$PROFILE'))")
step "one chat through :8000"
chat "$SERVED"

step "kill the follower's rank on $OTHER: every rank must end and come back"
if [ -n "${SSH:-}" ]; then
  RANK_PID=$($SSH traylm status --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['spread']['ranks_here'][0]['pid'])")
  $SSH kill -KILL "$RANK_PID"
else
  read -r -p "kill the headless vLLM process on $OTHER now, then press enter " _
fi
"$PY" - "$PROFILE" <<'PYEOF'
import json, subprocess, sys, time
name = sys.argv[1]
def state():
    out = subprocess.run([".venv/bin/traylm", "status", "--json"], capture_output=True, text=True)
    return next(e for e in json.loads(out.stdout)["engines"] if e["engine_id"] == name)
deadline = time.monotonic() + 60
while state()["state"] == "ready":
    assert time.monotonic() < deadline, "the head did not notice the dead rank within 60 s"
    time.sleep(0.5)
print("head noticed:", state()["detail"])
deadline = time.monotonic() + 900
while state()["state"] != "ready":
    assert state()["state"] != "failed", state()["detail"]
    assert time.monotonic() < deadline, "not back within 15 minutes"
    time.sleep(1)
print("both ranks back")
PYEOF
chat "$SERVED"

step "stop"
"$TRAYLM" stop "$PROFILE"
echo "PASS"

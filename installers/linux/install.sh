#!/usr/bin/env bash
# Install traylm for the current user (no root needed):
#   - a virtual environment under the data dir (~/.local/share/traylm/venv)
#   - `traylm` and `traylm-gpud` linked into ~/.local/bin
#   - a desktop entry (menu) with its icon and, with --service, a systemd user unit for the daemon
# Options: --run (start traylm afterwards), --service (enable the daemon at login), --dev (editable)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
run=0; service=0; editable=()
for arg in "$@"; do
  case "$arg" in
    --run) run=1 ;;
    --service) service=1 ;;
    --dev) editable=(-e) ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "traylm needs Python 3.11 or newer"'
data="${XDG_DATA_HOME:-$HOME/.local/share}/traylm"
venv="$data/venv"
bin="$HOME/.local/bin"
mkdir -p "$data" "$bin"
if [ ! -x "$venv/bin/python" ]; then
  echo "traylm: creating $venv"
  "$PY" -m venv "$venv"
fi
echo "traylm: installing into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${editable[@]}" "$repo" 2>&1 | grep -v "is ignored" || true
"$venv/bin/python" -c "import engines" || { echo "traylm: install failed" >&2; exit 1; }
ln -sf "$venv/bin/traylm" "$bin/traylm"
ln -sf "$venv/bin/traylm-gpud" "$bin/traylm-gpud"

"$here/install-desktop-entry.sh" "$bin/traylm"

if [ "$service" = 1 ]; then
  units="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
  mkdir -p "$units"
  sed "s|@BIN@|$bin/traylm|g" "$here/traylm.service" > "$units/traylm.service"
  systemctl --user daemon-reload && systemctl --user enable --now traylm.service
fi

case ":$PATH:" in *":$bin:"*) ;; *) echo "traylm: add $bin to your PATH";; esac
echo "traylm: installed $("$bin/traylm" --version)"
if [ "$run" = 1 ]; then
  exec "$bin/traylm"
fi

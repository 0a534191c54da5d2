#!/usr/bin/env bash
# Install traylm for the current user (no root needed):
#   - a virtual environment under the data dir (~/.local/share/traylm/venv)
#   - `traylm` and `traylm-gpud` linked into ~/.local/bin
#   - a desktop entry (menu) with its icon and, with --service, a systemd user unit for the daemon
# Options: --run (start traylm afterwards), --service (enable the daemon at login), --dev (editable),
#          --add-to-path (add ~/.local/bin to PATH in your shell's start-up file if it is missing)
# Every step says what it does; everything placed is listed in the data dir's
# install-manifest.txt, which installers/linux/uninstall.sh reads to remove it again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
run=0; service=0; add_path=0; editable=()
for arg in "$@"; do
  case "$arg" in
    --run) run=1 ;;
    --service) service=1 ;;
    --dev) editable=(-e) ;;
    --add-to-path) add_path=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

started=$SECONDS
total=6; [ "$service" = 1 ] && total=7
n=0
step() { n=$((n + 1)); printf 'traylm [%d/%d, %3ds] %s\n' "$n" "$total" "$((SECONDS - started))" "$*"; }
# pip's own lines, shortened to what shows progress (which package, how big, installing)
pip_progress() {
  grep --line-buffered -E '^(Collecting|Downloading|Using cached|Installing collected|Successfully|ERROR|error)' \
    | sed -u -E 's/^/    /; s/(.{0,150}).*/\1/' || true
}

PY=${PYTHON:-python3}
step "checking Python ($PY)"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "traylm needs Python 3.11 or newer"' || {
  echo "traylm: $PY is older than 3.11; install Python 3.11+ (Debian/Ubuntu: apt install python3.11-venv) and run again with PYTHON=python3.11" >&2
  exit 1
}
"$PY" -c 'import venv, ensurepip' 2>/dev/null || {
  echo "traylm: $PY has no venv/ensurepip module; Debian/Ubuntu: sudo apt install python3-venv" >&2
  exit 1
}
data="${XDG_DATA_HOME:-$HOME/.local/share}/traylm"
venv="$data/venv"
bin="$HOME/.local/bin"
manifest="$data/install-manifest.txt"
mkdir -p "$data" "$bin"
placed() { grep -qxF "$1" "$manifest" 2>/dev/null || echo "$1" >> "$manifest"; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating the environment at $venv"
  "$PY" -m venv "$venv"
else
  step "reusing the environment at $venv"
fi
placed "$venv"

step "installing traylm and its libraries into it (PySide6 is the big one, about 100 MB)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
# A packaged install keeps the GPU helper's installer (it runs as root, from a root-owned venv)
# in $gpud with the wheel it installs from, so `sudo bash $gpud/install-gpud.sh` works after the
# source is gone; an editable install (--dev) keeps using the checkout's.
gpud="$data/gpud"
source=("$repo")
if [ ${#editable[@]} = 0 ]; then
  rm -rf "$gpud" && mkdir -p "$gpud"
  "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$gpud" "$repo" 2>&1 \
    | pip_progress
  cp "$here/install-gpud.sh" "$here/traylm-gpud.service" "$gpud/"
  placed "$gpud"
  source=("$gpud"/traylm-*.whl)
fi
"$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off "${editable[@]}" "${source[@]}" 2>&1 \
  | pip_progress
"$venv/bin/python" -c "import engines, desktop" || { echo "traylm: the install failed (see pip's lines above)" >&2; exit 1; }

step "linking traylm and traylm-gpud into $bin"
ln -sf "$venv/bin/traylm" "$bin/traylm"
ln -sf "$venv/bin/traylm-gpud" "$bin/traylm-gpud"
placed "$bin/traylm"
placed "$bin/traylm-gpud"

step "adding the menu entry and its icon"
"$here/install-desktop-entry.sh" "$bin/traylm"
share="${XDG_DATA_HOME:-$HOME/.local/share}"
placed "$share/applications/traylm.desktop"
placed "$share/icons/hicolor/scalable/apps/traylm.svg"

if [ "$service" = 1 ]; then
  units="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
  step "enabling the daemon at login ($units/traylm.service)"
  mkdir -p "$units"
  sed "s|@BIN@|$bin/traylm|g" "$here/traylm.service" > "$units/traylm.service"
  placed "$units/traylm.service"
  systemctl --user daemon-reload && systemctl --user enable --now traylm.service
fi

step "checking that traylm is on your PATH"
case "$SHELL" in
  */zsh) rc="$HOME/.zshrc"; line='export PATH="$HOME/.local/bin:$PATH"' ;;
  */fish) rc="${XDG_CONFIG_HOME:-$HOME/.config}/fish/conf.d/traylm-path.fish"; line="fish_add_path $bin" ;;
  *) rc="$HOME/.bashrc"; line='export PATH="$HOME/.local/bin:$PATH"' ;;
esac
case ":$PATH:" in
  *":$bin:"*) echo "    $bin is on PATH: \`traylm\` works in any new terminal" ;;
  *)
    if [ "$add_path" = 1 ]; then
      mkdir -p "$(dirname "$rc")"
      if ! grep -qxF "$line" "$rc" 2>/dev/null; then
        [ -s "$rc" ] && [ -n "$(tail -c1 "$rc")" ] && echo >> "$rc"  # end the user's last line
        printf '# added by traylm install.sh\n%s\n' "$line" >> "$rc"
      fi
      placed "path-line $rc $line"
      echo "    added to $rc: $line (open a new terminal, or run it now)"
    else
      echo "    $bin is NOT on your PATH, so \`traylm\` is not found yet. Either run:"
      echo "      echo '$line' >> $rc   # then open a new terminal"
      echo "    or run install.sh again with --add-to-path, or call $bin/traylm directly."
    fi
    ;;
esac

echo "traylm: installed $("$bin/traylm" --version) in $((SECONDS - started)) s; to remove it: bash $here/uninstall.sh"
echo "traylm: next: \`traylm\` opens the tray app and its setup (or \`traylm doctor\` checks this computer)"
if [ "$run" = 1 ]; then
  exec "$bin/traylm"
fi

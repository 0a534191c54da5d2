#!/usr/bin/env bash
# Install traylm-gpud, the privileged GPU helper (fan curves, power limits). Run with sudo:
#   sudo bash installers/linux/install-gpud.sh [--user NAME] [--uninstall]
#   (an install by install.sh keeps a copy: sudo bash ~/.local/share/traylm/gpud/install-gpud.sh)
# - a root-owned virtual environment in /opt/traylm-gpud (never the user's venv: root must not
#   run code that an unprivileged user can edit)
# - the system group `traylm`, with NAME (default: the user who ran sudo) added to it
# - /etc/systemd/system/traylm-gpud.service, enabled and started
# Log out and back in afterwards so that the group membership applies.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
prefix=/opt/traylm-gpud
unit=/etc/systemd/system/traylm-gpud.service
user="${SUDO_USER:-}"
uninstall=0
while [ $# -gt 0 ]; do
  case "$1" in
    --user) user="$2"; shift ;;
    --uninstall) uninstall=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install-gpud.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" != 0 ]; then
  echo "install-gpud.sh: run it with sudo (it installs a system service)" >&2
  exit 1
fi

if [ "$uninstall" = 1 ]; then
  systemctl disable --now traylm-gpud.service 2>/dev/null || true  # ExecStopPost restores fans
  rm -f "$unit"
  systemctl daemon-reload
  rm -rf "$prefix"
  echo "traylm-gpud removed (the traylm group and /var/lib/traylm-gpud are kept)"
  exit 0
fi

command -v nvidia-smi >/dev/null || echo "install-gpud.sh: warning: nvidia-smi not found; install the NVIDIA driver first"
getent group traylm >/dev/null || groupadd --system traylm
if [ -n "$user" ] && [ "$user" != root ]; then
  usermod -aG traylm "$user"
  echo "traylm-gpud: added $user to the traylm group"
fi

PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "traylm needs Python 3.11 or newer"'
[ -x "$prefix/bin/python" ] || "$PY" -m venv "$prefix"
"$prefix/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
# the wheel install.sh kept beside this script (a packaged install), else the source checkout
wheel=$(ls "$here"/traylm-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$wheel" ]; then
  source=$wheel
elif [ -f "$repo/pyproject.toml" ]; then
  source=$repo
else
  echo "install-gpud.sh: no traylm wheel beside this script and no source checkout above it; run the install-gpud.sh that traylm's install.sh kept (traylm doctor names it)" >&2
  exit 1
fi
"$prefix/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "$source" 2>&1 | grep -v "is ignored" || true
"$prefix/bin/traylm-gpud" --help >/dev/null
chown -R root:root "$prefix"
chmod -R go-w "$prefix"

sed "s|@PREFIX@|$prefix|g" "$here/traylm-gpud.service" > "$unit"
chmod 0644 "$unit"
systemctl daemon-reload
systemctl enable --now traylm-gpud.service
systemctl --no-pager --lines=3 status traylm-gpud.service || true
echo "traylm-gpud: installed. Log out and back in (group traylm), then \`traylm gpus\` shows it."

#!/usr/bin/env bash
# Debian packages the real-tray tests (marker `tray`) and the screenshot script need: an X server
# (Xvfb), an XEmbed system tray (trayer), input injection (xdotool), screenshots (imagemagick),
# fonts, the xcb/xkb/EGL libraries Qt's xcb platform plugin loads, and Chromium for the docs
# browser test (marker `browser`). Installs what is missing with apt-get, quietly; a no-op when
# everything is present. tests/run.sh calls it (non-quick).
set -euo pipefail

packages=(
  xvfb trayer xdotool imagemagick x11-utils fonts-dejavu-core
  libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-randr0
  libxcb-render-util0 libxcb-xinerama0 libxcb-image0 libegl1 libgl1 libfontconfig1 libdbus-1-3
  chromium
)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo -n)
else
  echo "install-x11-deps: missing ${missing[*]}; install them as root:" >&2
  echo "  apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

echo "install-x11-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq >/dev/null
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1 \
  | { grep -v -e "^debconf: " -e "^$" || true; } >&2

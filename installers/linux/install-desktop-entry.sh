#!/usr/bin/env bash
# Install traylm's menu entry and icon for the current user (called by install.sh):
#   $XDG_DATA_HOME/applications/traylm.desktop      (Exec= the given traylm command)
#   $XDG_DATA_HOME/icons/hicolor/scalable/apps/traylm.svg   (what Icon=traylm resolves to)
# Usage: install-desktop-entry.sh /path/to/traylm
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${1:?usage: install-desktop-entry.sh /path/to/traylm}
share="${XDG_DATA_HOME:-$HOME/.local/share}"

apps="$share/applications"
mkdir -p "$apps"
sed "s|@BIN@|$bin|g" "$here/traylm.desktop" > "$apps/traylm.desktop"

hicolor="$share/icons/hicolor"
mkdir -p "$hicolor/scalable/apps"
cp "$repo/resources/icons/traylm.svg" "$hicolor/scalable/apps/traylm.svg"
touch "$hicolor"  # an icon cache there, if any, is now older than the folder: looked past
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$apps" || true
echo "traylm: menu entry $apps/traylm.desktop, icon $hicolor/scalable/apps/traylm.svg"

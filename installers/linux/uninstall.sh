#!/usr/bin/env bash
# Remove what installers/linux/install.sh placed for the current user: the daemon (stopped
# first, and its systemd user unit), the environment, the `traylm`/`traylm-gpud` links, the menu
# entry and icon, the autostart entry, and the PATH line --add-to-path wrote. It reads the data
# dir's install-manifest.txt and also looks at the places install.sh uses, so an install older
# than the manifest goes too.
# Options: --purge  also delete traylm's settings, profiles, engine environments, database and
#                   logs (the config, data, state and cache dirs). Models in the shared Hugging
#                   Face cache are never deleted: other tools use them (`traylm models rm` first).
#          --yes    do not ask before --purge
# The root helper is separate: `sudo installers/linux/install-gpud.sh --uninstall`.
set -euo pipefail
purge=0; yes=0
for arg in "$@"; do
  case "$arg" in
    --purge) purge=1 ;;
    --yes) yes=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "uninstall.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

config="${XDG_CONFIG_HOME:-$HOME/.config}"
share="${XDG_DATA_HOME:-$HOME/.local/share}"
data="$share/traylm"
bin="$HOME/.local/bin"
manifest="$data/install-manifest.txt"
removed=0
gone() { echo "traylm: removed $1"; removed=$((removed + 1)); }
remove() {  # a file, link or folder, if it is there
  if [ -e "$1" ] || [ -L "$1" ]; then rm -rf -- "$1"; gone "$1"; fi
}

if [ -x "$bin/traylm" ]; then
  echo "traylm: stopping the daemon and its engines (traylm shutdown)"
  "$bin/traylm" shutdown 2>/dev/null || true
fi
unit="$config/systemd/user/traylm.service"
if [ -f "$unit" ] && command -v systemctl >/dev/null 2>&1; then
  systemctl --user disable --now traylm.service 2>/dev/null || true
fi

paths=()
if [ -f "$manifest" ]; then
  while IFS= read -r line; do
    case "$line" in
      "path-line "*)
        rest=${line#path-line }; rc=${rest%% *}; text=${rest#* }
        if [ -f "$rc" ] && grep -qxF "$text" "$rc"; then
          grep -vxF "$text" "$rc" | grep -vxF "# added by traylm install.sh" > "$rc.traylm-tmp" || true
          mv "$rc.traylm-tmp" "$rc"
          gone "the PATH line from $rc"
        fi
        ;;
      ?*) paths+=("$line") ;;
    esac
  done < "$manifest"
fi
paths+=("$bin/traylm" "$bin/traylm-gpud" "$data/venv" "$share/applications/traylm.desktop"
        "$share/icons/hicolor/scalable/apps/traylm.svg" "$unit" "$config/autostart/traylm.desktop")
for p in "${paths[@]}"; do
  remove "$p"
done
remove "$manifest"
if [ -f "$unit" ] || [ "$removed" -gt 0 ]; then
  command -v systemctl >/dev/null 2>&1 && systemctl --user daemon-reload 2>/dev/null || true
fi

if [ "$purge" = 1 ]; then
  dirs=("$config/traylm" "$data" "${XDG_STATE_HOME:-$HOME/.local/state}/traylm"
        "${XDG_CACHE_HOME:-$HOME/.cache}/traylm")
  if [ "$yes" != 1 ]; then
    echo "traylm: --purge deletes ${dirs[*]} (settings, profiles, engine environments, database, logs)."
    read -r -p "Delete them? [y/N] " answer
    case "$answer" in y|Y|yes) ;; *) echo "traylm: kept them"; purge=0 ;; esac
  fi
  if [ "$purge" = 1 ]; then
    for d in "${dirs[@]}"; do remove "$d"; done
  fi
fi

if [ "$removed" = 0 ]; then
  echo "traylm: nothing to remove (traylm is not installed for this user)"
else
  echo "traylm: uninstalled. Models in the Hugging Face cache stay (other tools share them)."
  [ "$purge" = 1 ] || echo "traylm: settings and engine environments stay; --purge removes them too"
fi

"""installers/linux/install-desktop-entry.sh (run by install.sh): the menu entry and the icon its
``Icon=traylm`` names, found by a real icon-theme lookup (Qt's, over the hicolor theme)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from PySide6.QtGui import QIcon

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "installers" / "linux" / "install-desktop-entry.sh"


def test_menu_entry_and_icon_are_installed_and_the_icon_resolves(qtbot, tmp_path: Path) -> None:
    share = tmp_path / "share"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(share)}
    out = subprocess.run(
        ["bash", str(SCRIPT), "/opt/bin/traylm"], env=env, capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    assert "icon" in out.stdout
    entry = (share / "applications" / "traylm.desktop").read_text()
    assert "Exec=/opt/bin/traylm\n" in entry and "Icon=traylm\n" in entry
    icon = share / "icons" / "hicolor" / "scalable" / "apps" / "traylm.svg"
    assert icon.read_bytes() == (ROOT / "resources" / "icons" / "traylm.svg").read_bytes()
    system = Path("/usr/share/icons")
    if not (system / "hicolor" / "index.theme").exists():
        pytest.skip("no hicolor theme index on this system (Debian: hicolor-icon-theme)")
    search, theme = QIcon.themeSearchPaths(), QIcon.themeName()
    try:  # the user's data dir first, then the system's: as desktops look icons up
        QIcon.setThemeSearchPaths([str(share / "icons"), str(system)])
        QIcon.setThemeName("hicolor")
        found = QIcon.fromTheme("traylm")
        assert not found.isNull() and not found.pixmap(48, 48).isNull()
    finally:
        QIcon.setThemeSearchPaths(search)
        QIcon.setThemeName(theme)


def test_install_sh_installs_the_desktop_entry_through_it() -> None:
    text = (ROOT / "installers" / "linux" / "install.sh").read_text()
    assert '"$here/install-desktop-entry.sh" "$bin/traylm"' in text

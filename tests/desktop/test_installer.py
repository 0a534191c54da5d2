"""The installers: install-desktop-entry.sh (the menu entry and the icon its ``Icon=traylm``
names, found by a real icon-theme lookup), install.sh and uninstall.sh for real in a private HOME
(steps shown, PATH handled, everything removed again), and a built wheel installed with pipx and
with ``uv tool`` (it carries resources/)."""

from __future__ import annotations

import os
import subprocess
import sys
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


def _user_env(home: Path) -> dict[str, str]:
    """A fresh user: a private HOME, no XDG overrides, and a PATH without ~/.local/bin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "TRAYLM_"))}
    env.update(HOME=str(home), SHELL="/bin/bash", PATH="/usr/local/bin:/usr/bin:/bin")
    env["PYTHON"] = _base_python()
    return env


def _base_python() -> str:
    """The interpreter the test venv was made from (install.sh makes a venv of its own)."""
    return str(Path(sys.base_prefix) / "bin" / "python3")


@pytest.mark.slow
def test_install_sh_shows_its_steps_puts_traylm_on_path_and_uninstall_removes_all(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the user's own line\nalias ll='ls -l'\n")
    env = _user_env(home)
    out = subprocess.run(
        ["bash", str(ROOT / "installers" / "linux" / "install.sh")],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    steps = [line for line in out.stdout.splitlines() if line.startswith("traylm [")]
    assert [s.split(",")[0] for s in steps] == [f"traylm [{i}/6" for i in range(1, 7)]
    assert any(line.startswith("    Collecting ") for line in out.stdout.splitlines())
    assert "is NOT on your PATH" in out.stdout
    assert (
        """echo 'export PATH="$HOME/.local/bin:$PATH"' >> """ + str(home / ".bashrc") in out.stdout
    )
    traylm = home / ".local" / "bin" / "traylm"
    version = subprocess.run([str(traylm), "--version"], env=env, capture_output=True, text=True)
    assert version.stdout.strip() == "traylm 0.1.0"
    # the GPU helper's installer is kept with the wheel it installs from, and the daemon names it
    gpud = home / ".local/share/traylm/gpud"
    assert {p.name for p in gpud.iterdir()} >= {"install-gpud.sh", "traylm-gpud.service"}
    assert list(gpud.glob("traylm-0.1.0-*.whl"))
    python = (home / ".local/share/traylm/venv/bin/python").as_posix()
    hint = subprocess.run(
        [python, "-c", "from engines.gpu.helper_client import install_hint; print(install_hint())"],
        env=env, capture_output=True, text=True, check=True, cwd=home,
    ).stdout  # fmt: skip
    assert f"sudo bash {gpud}/install-gpud.sh" in hint, hint

    again = subprocess.run(
        ["bash", str(ROOT / "installers" / "linux" / "install.sh"), "--add-to-path"],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reusing the environment" in again.stdout
    assert 'export PATH="$HOME/.local/bin:$PATH"' in (home / ".bashrc").read_text()
    found = subprocess.run(["bash", "-ic", "command -v traylm"], env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert found.stdout.strip() == str(traylm)  # a new terminal finds it
    manifest = (home / ".local/share/traylm/install-manifest.txt").read_text().splitlines()
    assert str(home / ".local/share/applications/traylm.desktop") in manifest

    gone = subprocess.run(
        ["bash", str(ROOT / "installers" / "linux" / "uninstall.sh"), "--purge", "--yes"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert gone.returncode == 0, gone.stdout + gone.stderr
    for path in ("bin/traylm", "bin/traylm-gpud", "share/traylm",
                 "share/applications/traylm.desktop",
                 "share/icons/hicolor/scalable/apps/traylm.svg"):  # fmt: skip
        assert not (home / ".local" / path).exists(), path
    assert (home / ".bashrc").read_text() == "# the user's own line\nalias ll='ls -l'\n"
    assert "uninstalled" in gone.stdout
    nothing = subprocess.run(
        ["bash", str(ROOT / "installers" / "linux" / "uninstall.sh")],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "nothing to remove" in nothing.stdout


def test_the_helper_hint_names_the_installer_this_computer_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint named `installers/linux/install-gpud.sh`, which exists only in a
    source checkout. A packaged install names the copy install.sh keeps; a pipx/uv install (no
    copy) says where the installer comes from."""
    from engines.gpu import helper_client

    assert helper_client.SOURCE_INSTALLER == ROOT / "installers" / "linux" / "install-gpud.sh"
    assert f"`sudo bash {helper_client.SOURCE_INSTALLER}`" in helper_client.install_hint()
    monkeypatch.setattr(helper_client, "SOURCE_INSTALLER", tmp_path / "gone" / "install-gpud.sh")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    kept = tmp_path / "share" / "traylm" / "gpud" / "install-gpud.sh"
    assert "from traylm's source" in helper_client.install_hint()
    assert str(kept.parent) in helper_client.install_hint()
    kept.parent.mkdir(parents=True)
    kept.write_text("#!/bin/sh\n")
    assert f"`sudo bash {kept}`" in helper_client.install_hint()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    [built] = out.glob("traylm-*.whl")
    return built


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["pipx", "uv"])
def test_a_built_wheel_installs_as_a_tool_and_carries_its_resources(
    tmp_path: Path, wheel: Path, tool: str
) -> None:
    exe = Path(sys.executable).with_name(tool)
    if not exe.exists():
        pytest.skip(f"{tool} is not installed next to this Python (pip install '.[dev]')")
    bins = tmp_path / "bin"
    env = {**os.environ, "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(bins),
           "PIPX_MAN_DIR": str(tmp_path / "man"), "UV_TOOL_DIR": str(tmp_path / "uv"),
           "UV_TOOL_BIN_DIR": str(bins), "TRAYLM_HOME": str(tmp_path / "traylm")}  # fmt: skip
    command = [str(exe), "install", str(wheel)] if tool == "pipx" else [
        str(exe), "tool", "install", str(wheel)]  # fmt: skip
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
    traylm = bins / "traylm"
    assert subprocess.run([str(traylm), "--version"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "traylm 0.1.0"  # fmt: skip
    profiles = subprocess.run([str(traylm), "profiles"], env=env, capture_output=True, text=True)
    assert "llama-3.1-8b-1gpu" in profiles.stdout  # the presets ship in resources/
    python = traylm.resolve().with_name("python")
    check = (
        "from engines.config.sections import resources_dir as r; "
        "names = ['starters.toml', 'icons/traylm.svg', 'probes/argparse_flags.py', "
        "'flags/vllm-0.32.0.json', 'fans/quiet.toml', 'power/stock.toml']; "
        "missing = [n for n in names if not (r() / n).is_file()]; "
        "print(str(r()), missing)"
    )
    found = subprocess.run([str(python), "-c", check], env=env, capture_output=True, text=True,
                           check=True, cwd=tmp_path).stdout  # fmt: skip
    assert found.strip().endswith("[]"), found
    assert str(ROOT) not in found  # the installed copy, not this checkout

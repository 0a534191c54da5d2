"""The desktop app puts names into control-API paths only through engines.client, which quotes
each as one segment and refuses what is not a profile-style name with the rule
(tests/engines/control/test_names_in_paths.py covers the CLI and the daemon)."""

from __future__ import annotations

from desktop.app import DesktopApp
from desktop.dashboard.engines_page import EnginesPage
from tests.desktop.conftest import ThreadedDaemon


def test_the_profile_editor_shows_the_name_rule_for_a_hostile_name(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    """Before quoting, the editor's check of '../fake#' went to another route and showed
    "no route"; now it shows the rule, and Save stays off."""
    daemon_thread.write_fake_profile("fake")
    app.actions.reload_profiles()
    page = app.open_dashboard("engines").page("engines")
    assert isinstance(page, EnginesPage)
    page.tabs.setCurrentWidget(page.profiles)
    editor = page.profiles
    qtbot.waitUntil(lambda: editor.list.count() > 0)
    editor.load_profile("fake")
    qtbot.waitUntil(lambda: editor.valid, timeout=5000)
    editor.name.setText("../fake#")
    qtbot.waitUntil(lambda: "1-64 letters" in editor.validation.text(), timeout=5000)
    assert "is not a valid profile name" in editor.validation.text()
    assert not editor.valid and not editor.save_button.isEnabled()
    assert sorted(p.name for p in daemon_thread.paths.profiles_dir.iterdir()) == ["fake.toml"]

"""The docs site: the pages made from the code are current (docs/gen.py --check), and the site
builds with `mkdocs build --strict`, where a broken link or a page left out of the nav fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_pages_are_current() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr  # names each stale page and the fix


def mkdocs_build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strict(tmp_path: Path) -> None:
    run = mkdocs_build(ROOT, tmp_path / "site")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "commands" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "security.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    run = mkdocs_build(copy, tmp_path / "site")
    assert run.returncode != 0
    assert "no-such-page.md" in run.stdout + run.stderr

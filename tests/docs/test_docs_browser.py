"""A docs page in a real browser: the site built with MkDocs, served over real HTTP, and a page
screenshotted by headless Chromium (Debian's ``chromium``; tests/desktop/install-x11-deps.sh
installs it). The picture must show the theme's styled header over a white page with text, which
fails when the stylesheet or the page does not load."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from tests.docs.test_docs import ROOT, mkdocs_build

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTH, HEIGHT = 1280, 900
MATERIAL_INDIGO = (0x40, 0x51, 0xB5)  # Material for MkDocs' default primary colour


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    site = tmp_path_factory.mktemp("site")
    built = mkdocs_build(ROOT, site)
    assert built.returncode == 0, built.stdout + built.stderr
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def screenshot(url: str, out: Path) -> Path:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium missing: run tests/desktop/install-x11-deps.sh")
    shot = out / "page.png"
    argv = [
        browser,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={out / 'profile'}",
        f"--window-size={WIDTH},{HEIGHT}",
        f"--screenshot={shot}",
        url,
    ]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and shot.exists(), done.stdout + done.stderr
    return shot


def _near(pixel: tuple[int, ...], colour: tuple[int, int, int], tolerance: int = 12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], colour, strict=True))


def test_a_docs_page_renders_styled_in_headless_chromium(site_url: str, tmp_path: Path) -> None:
    shot = screenshot(f"{site_url}/figures/", tmp_path)
    assert shot.stat().st_size > 20_000
    with Image.open(shot) as opened:
        image = opened.convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    header = [image.getpixel((x, 4)) for x in range(300, 900, 20)]
    assert all(_near(p, MATERIAL_INDIGO) for p in header), header[:3]  # the stylesheet loaded
    body = image.crop((300, 120, 980, HEIGHT))
    colours = body.getcolors(maxcolors=1 << 16) or []
    white = sum(count for count, c in colours if _near(c, (255, 255, 255), 4))
    dark = sum(count for count, c in colours if max(c) < 120)
    pixels = body.width * body.height
    assert white > pixels // 2  # a page, not a blank or an error screen
    assert dark > pixels // 200  # with text on it
    assert len(colours) > 50  # anti-aliased text, not one flat colour

"""How far a ``pip install`` has got, read from pip's own output lines.

pip says what it resolves ("Collecting X"), which file it fetches and how big it is
("Downloading X.whl (880.2 MB)", "Using cached ...", "Processing /local/X.whl"), and when it
installs ("Installing collected packages: ..."). With ``--progress-bar raw`` (pip 24.1 and
newer, see ``supports_raw``) it also prints "Progress N of M" about four times a second while a
file over 512 KiB downloads, which gives the bytes. ``PipProgress.feed`` turns those lines into
``PipStatus`` values; other lines give None.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

_SIZE = re.compile(r"\((\d+(?:\.\d+)?) (bytes|kB|MB|GB)\)\s*$")
_UNITS = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}  # pip's decimal units
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
_NEXT = (
    "Collecting ",
    "Downloading ",
    "Using cached ",
    "Processing ",
    "Installing collected",
    "Successfully installed",
)


@dataclass(frozen=True)
class PipStatus:
    step: str  # resolving | downloading | installing | done
    package: str  # what pip works on ("" while installing all of them)
    done_bytes: int  # downloaded so far, every file together
    file_done_bytes: int  # of the file downloading now
    file_total_bytes: int  # its size (0: not known)
    files: int  # files fetched so far (downloaded, cached or local)
    packages: int  # packages being installed (known once pip installs)


def supports_raw(install_help: str) -> bool:
    """Whether this pip prints byte progress (its ``pip install --help`` lists ``raw``)."""
    return bool(re.search(r"--progress-bar.*?\[[^\]]*\braw\b", install_help, re.S))


def _file_name(text: str) -> str:
    """'https://.../torch-2.3.0-cp311-....whl (880.2 MB)' → 'torch-2.3.0-cp311-....whl'."""
    text = _SIZE.sub("", text).strip()
    return text.rstrip("/").rsplit("/", 1)[-1]


class PipProgress:
    def __init__(self) -> None:
        self.status = PipStatus("resolving", "", 0, 0, 0, 0, 0)
        self._finished_bytes = 0  # files downloaded completely
        self._unreported = 0  # a file pip downloaded without progress lines (under 512 KiB)

    def feed(self, line: str) -> PipStatus | None:
        text = line.strip()
        s = self.status
        found = _PROGRESS.match(text)
        if found:
            done, total = int(found.group(1)), int(found.group(2))
            new = dataclasses.replace(
                s,
                done_bytes=self._finished_bytes + done,
                file_done_bytes=done,
                file_total_bytes=total or s.file_total_bytes,
            )
            self._unreported = 0
            if total and done >= total:
                self._finished_bytes += total
                new = dataclasses.replace(new, done_bytes=self._finished_bytes)
        elif self._unreported and text.startswith(_NEXT):  # the small file before is done
            self._finished_bytes += self._unreported
            self._unreported = 0
            self.status = dataclasses.replace(s, done_bytes=self._finished_bytes)
            return self.feed(line)
        elif text.startswith("Collecting "):
            name = _NAME.match(text.removeprefix("Collecting "))
            new = dataclasses.replace(s, step="resolving", package=name.group(1) if name else "")
        elif text.startswith(("Downloading ", "Using cached ", "Processing ")):
            rest = (
                text.split(" ", 2)[-1]
                if text.startswith("Using cached ")
                else text.split(" ", 1)[1]
            )
            size = _SIZE.search(text)
            total = int(float(size.group(1)) * _UNITS[size.group(2)]) if size else 0
            downloading = text.startswith("Downloading ")
            self._unreported = total if downloading else 0
            new = dataclasses.replace(
                s,
                step="downloading",
                package=_file_name(rest),
                file_done_bytes=0,
                file_total_bytes=total if downloading else 0,
                files=s.files + 1,
            )
        elif text.startswith("Installing collected packages:"):
            names = [n for n in text.split(":", 1)[1].split(",") if n.strip()]
            new = dataclasses.replace(s, step="installing", package="", packages=len(names))
        elif text.startswith("Successfully installed"):
            new = dataclasses.replace(s, step="done", package="")
        else:
            return None
        self.status = new
        return new

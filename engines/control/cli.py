"""The commands that talk to the daemon about its engines, profiles, settings and keys
(``status``, ``start``, ``stop``, ``restart``, ``logs``, ``shutdown``, ``profiles``,
``config``, ``keys``; engines/cli.py dispatches to them). ``status`` is a one-shot command
(blocking calls, no event loop: engines/client/oneshot.py); the others import the async client
in their function, and ``start --wait`` follows the start's phases (follow.py).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from engines.config.paths import Paths
from engines.errors import DaemonUnavailable, TraylmError

if TYPE_CHECKING:
    from engines.client import DaemonClient
    from engines.events.core import EngineStatus

SHUTDOWN_WAIT_S = 60.0


# --------------------------------------------------------------------------- parsers


def add_parsers(sub: Any) -> None:
    """The commands that talk to the daemon about engines, profiles, settings and keys:
    status, start, stop, restart, logs, shutdown, profiles, config, keys."""
    s = sub.add_parser("status", help="daemon and engine status")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("start", help="start an engine from a profile, or --model for a quick one")
    s.add_argument(
        "profile",
        nargs="?",
        metavar="PROFILE|FOLDER",
        help="a profile (`traylm profiles` lists them) or a model folder registered with "
        "`traylm models add`",
    )
    s.add_argument("--model", help="repo id or local folder (instead of a profile)")
    s.add_argument(
        "--engine", default="vllm", help="engine for --model: vllm, sglang or trtllm (default vllm)"
    )
    s.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where --model runs: auto (an NVIDIA GPU if there is one), cuda or cpu",
    )
    s.add_argument("--name", help="engine id for --model (default: from the model name)")
    s.add_argument(
        "--served-name", help="model name clients send for --model (default: its last path part)"
    )
    s.add_argument(
        "--max-model-len",
        type=int,
        metavar="TOKENS",
        help="context length in tokens for --model (default: the model's)",
    )
    s.add_argument("--wait", action="store_true", help="wait until ready (or failed)")
    s.add_argument("--timeout", type=float, default=900.0, help="seconds to --wait")
    s.add_argument(
        "--print-command",
        action="store_true",
        help="print the command line and environment traylm would run for PROFILE on this "
        "computer (GPU placement included) and start nothing",
    )
    s.set_defaults(func=cmd_start)

    for name, helptext, func in (
        ("stop", "stop an engine", cmd_stop),
        ("restart", "restart an engine", cmd_restart),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("engine_id", nargs="?", help="default: the only running engine")
        s.set_defaults(func=func)

    s = sub.add_parser("logs", help="an engine's log")
    s.add_argument("engine_id", nargs="?", help="default: the only running engine")
    s.add_argument("-n", "--lines", type=int, default=100, help="how many last lines (100)")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("shutdown", help="stop the daemon and its engines")
    s.set_defaults(func=cmd_shutdown)

    _profiles_parser(sub)
    _config_parser(sub)
    _keys_parser(sub)


def _profiles_parser(sub: Any) -> None:
    s = sub.add_parser("profiles", help="list engine profiles (presets and yours)")
    s.add_argument("name", nargs="?", help="show one profile")
    s.set_defaults(func=cmd_profiles)


def _config_parser(sub: Any) -> None:
    c = sub.add_parser("config", help="read or change settings (config.toml)")
    csub = c.add_subparsers(title="config commands", metavar="ACTION", required=True)
    s = csub.add_parser("get", help="show settings")
    s.add_argument("key", nargs="?", help="a section or SECTION.KEY (default: every setting)")
    s.set_defaults(func=cmd_config_get)
    s = csub.add_parser("set", help="change a setting, e.g. gateway.port 8001")
    s.add_argument("key", help="SECTION.KEY, e.g. gateway.port")
    s.add_argument("value", help='a TOML value: 8001, true, \'text\', ["a", "b"]')
    s.set_defaults(func=cmd_config_set)


def _keys_parser(sub: Any) -> None:
    k = sub.add_parser("keys", help="API keys for the gateway (needed for LAN sharing)")
    ksub = k.add_subparsers(title="keys commands", metavar="ACTION", required=True)
    s = ksub.add_parser("add", help="create a key (shown once; only its SHA-256 is stored)")
    s.add_argument("--name", default="", help="who it is for (shown by `traylm keys list`)")
    s.set_defaults(func=cmd_keys_add)
    s = ksub.add_parser("ls", aliases=["list"], help="list key fingerprints")
    s.set_defaults(func=cmd_keys_list)
    s = ksub.add_parser(
        "rm", aliases=["remove"], help="remove a key by its fingerprint (or its first 8 chars)"
    )
    s.add_argument("fingerprint", help="as `traylm keys list` shows it (or its first 8 chars)")
    s.set_defaults(func=cmd_keys_remove)


# --------------------------------------------------------------------------- daemon


async def _client() -> DaemonClient:
    from engines.client import DaemonClient

    return await DaemonClient.connect(plain_calls=True)


def cmd_status(args: argparse.Namespace) -> int:
    import collections

    from engines.client.oneshot import OneShotClient
    from engines.config.replica_ids import replica_base

    c = OneShotClient.connect()
    data = c.status()
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
    if line := _ollama_line(data.get("ollama") or {}):
        print(line)
    disk = data.get("disk") or {}
    if disk.get("full"):
        print(f"  DISK FULL: {disk['message']}")
        print(
            f"  kept in memory until there is room: {disk['usage_rows_waiting']} usage rows, "
            f"{disk['replies_waiting']} chat replies"
        )
    if warning := (data.get("requests") or {}).get("warning"):
        print(f"  requests: {warning}")
    tune = data.get("tune") or {}
    if tune.get("state") == "interrupted":
        print(f"  tune #{tune['id']} of {tune['profile']} {tune['detail']}")
    engines = c.engines()
    if not engines:
        print("no engines; start one with `traylm start PROFILE` (`traylm profiles` lists them)")
    counts = collections.Counter(replica_base(e.engine_id) for e in engines)
    for e in engines:
        print(_engine_line(e, counts[replica_base(e.engine_id)]))
    return 0


def _ollama_line(ollama: dict[str, Any]) -> str:
    """Where Ollama's API is served, or why not (its port taken: who holds it, how to move)."""
    if ollama.get("state") == "serving":
        return f"  Ollama's API: http://127.0.0.1:{ollama['port']}/api"
    if ollama.get("state") == "taken":
        return f"  Ollama's API NOT served: {ollama['detail']}"
    return ""


def _engine_line(e: EngineStatus, replicas: int = 1) -> str:
    """One engine of `traylm status`; ``replicas``: the engines serving its model (a replica
    says which it is)."""
    from engines.config.replica_ids import replica_index
    from engines.events.core import EngineState
    from engines.runtime.phase_text import phase_text

    where = f"127.0.0.1:{e.port}" if e.port else "-"
    line = (
        f"  {e.engine_id:<24} {e.state:<9} {e.engine} {e.version} ({e.device})  "
        f"serves {', '.join(e.served_names)}  {where}"
    )
    if replicas > 1:
        gpus = f"GPU {','.join(str(g) for g in e.gpus)}" if e.gpus else e.device
        line += f"  replica {replica_index(e.engine_id)}/{replicas} on {gpus}"
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
    from engines.control.follow import follow_start
    from engines.events.core import EngineState
    from engines.runtime.phase_text import breakdown

    if not args.profile and not args.model:
        print(
            "traylm: name a profile (`traylm profiles` lists them) or give --model", file=sys.stderr
        )
        return 2
    if args.print_command:
        if not args.profile:
            print("traylm: --print-command needs a profile name", file=sys.stderr)
            return 2
        async with await _client() as c:
            print(command_text(await c.command(args.profile)), end="")
        return 0
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
            print(
                f"traylm: not ready after {args.timeout:.0f} s; it goes on starting in the "
                "daemon (`traylm status`, `traylm logs -f`)",
                file=sys.stderr,
            )
            return 1
        print(_engine_line(final))
        if final.state == EngineState.FAILED:
            return 1
        if breakdown(final):
            print(f"  started in {breakdown(final)}")
        print(f"ready: point apps at {c.info.url}/v1 with model {final.served_names[0]!r}")
    return 0


def command_text(command: dict[str, Any]) -> str:
    """``traylm start --print-command``: the environment traylm sets, then the command line,
    as one shell command (copy it to compare with upstream docs)."""
    import shlex

    lines = [
        f"# {command['profile']}: {command['engine']} {command['version']} ({command['device']}); "
        "nothing was started"
    ]
    lines += [f"# {note}" for note in command.get("notes", [])]
    if command.get("files"):
        lines.append("# files written to the run folder first: " + ", ".join(command["files"]))
    env = command.get("env", {})
    lines += [f"{key}={shlex.quote(str(value))} \\" for key, value in sorted(env.items())]
    lines.append(shlex.join(str(a) for a in command["argv"]))
    return "\n".join(lines) + "\n"


async def _pick_engine(c: DaemonClient, engine_id: str | None) -> str:
    from engines.events.core import EngineState

    if engine_id is not None:  # named, even '' (refused by the client): never another engine
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
    from engines.events.core import EngineLogLine, EngineStateChanged

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
    import asyncio

    from engines.client import pid_alive
    from engines.core import daemon_lock

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


# --------------------------------------------------------------------------- profiles, config


def cmd_profiles(args: argparse.Namespace) -> int:
    from engines.config.profiles import ProfileStore, profile_to_mapping

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


def cmd_config_get(args: argparse.Namespace) -> int:
    from engines.config.sections import load_settings
    from engines.events.codec import to_plain

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
    from engines.config.sections import load_settings, replace_setting, save_settings
    from engines.core import daemon_lock

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
    from engines.config.sections import load_settings
    from engines.gateway.security import hash_key, new_api_key

    key = new_api_key()
    gateway = load_settings(Paths.from_env().config_file).gateway
    where = await _save_setting("gateway.api_key_sha256", [*gateway.api_key_sha256, hash_key(key)])
    if args.name:
        names = {**gateway.api_key_names, hash_key(key)[:8]: args.name}
        await _save_setting("gateway.api_key_names", names)
    print(f"new API key (shown only now; {where}):\n{key}")
    print(f"fingerprint {hash_key(key)[:8]}. Clients send it as 'Authorization: Bearer KEY'.")
    return 0


async def cmd_keys_list(args: argparse.Namespace) -> int:
    from engines.config.sections import load_settings

    gateway = load_settings(Paths.from_env().config_file).gateway
    if not gateway.api_key_sha256:
        print("no API keys: the gateway serves loopback clients without one")
    for digest in gateway.api_key_sha256:
        name = gateway.api_key_names.get(digest[:8], "")
        print(f"{digest[:8]}  {name}" if name else digest[:8])
    return 0


async def cmd_keys_remove(args: argparse.Namespace) -> int:
    from engines.config.sections import load_settings

    digests = load_settings(Paths.from_env().config_file).gateway.api_key_sha256
    keep = [d for d in digests if not d.startswith(args.fingerprint.lower())]
    if len(keep) == len(digests):
        raise TraylmError(f"no key with fingerprint {args.fingerprint!r}; `traylm keys list`")
    where = await _save_setting("gateway.api_key_sha256", keep)
    names = load_settings(Paths.from_env().config_file).gateway.api_key_names
    kept = {fp: name for fp, name in names.items() if any(d.startswith(fp) for d in keep)}
    if kept != names:
        await _save_setting("gateway.api_key_names", kept)
    print(f"removed {len(digests) - len(keep)} key(s) ({where})")
    return 0

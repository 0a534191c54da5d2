"""``traylm doctor``: is this computer ready to serve models? One line per check, each with its
fix, and a non-zero exit status when something blocks serving.

Checks: the NVIDIA driver and its CUDA version (through NVML), NVML itself, the GPUs and
peer-to-peer between them, free disk space where models and engines go, the gateway port, the
engine environments, the root helper (traylm-gpud) and the tray (a graphical session with a
system tray). A missing driver blocks only when no CPU engine is installed; no engine at all, a
port held by another program and a nearly full disk always block.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engines.config.sections import Paths, Settings, load_settings
from engines.core.procs import port_holder
from engines.envs.manager import EnvInfo, EnvManager
from engines.gpu.helper_client import HelperClient

GIB = 1 << 30
DISK_BLOCK_BYTES = 2 * GIB  # less than this free: a download or an engine install fails
DISK_WARN_BYTES = 30 * GIB  # an 8B model in bf16 is 16 GB, the CUDA engine env about 8 GB
CUDA_MIN_MAJOR = 12  # the CUDA builds of vLLM, TensorRT-LLM and SGLang traylm installs need 12.x
# NVML's enum values (nvml.h). pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,) (a stray
# comma), which its own ctypes call would reject.
P2P_CAPS_INDEX_READ = 0
P2P_STATUS_OK = 0
P2P_TIMEOUT_S = 60.0  # CUDA init on two cards and the copies; a hung copy is what NCCL would do
P2P_COPY_MIB = 256
P2P_MARK = "TRAYLM_P2P "
P2P_SCRIPT = r"""
import json, sys, time
a, b, mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def say(**facts):
    print("TRAYLM_P2P " + json.dumps(facts), flush=True)
try:
    import torch
except Exception as exc:
    say(skipped="torch does not import in this engine env: %s" % exc)
    sys.exit(0)
count = torch.cuda.device_count() if torch.cuda.is_available() else 0
if count <= max(a, b):
    say(skipped="torch sees %d CUDA GPU(s)" % count)
    sys.exit(0)
peer = bool(torch.cuda.can_device_access_peer(a, b))
n = mib << 20
src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:%d" % a)
want = int(src.to(torch.int64).sum().item())
dst = torch.empty(n, dtype=torch.uint8, device="cuda:%d" % b)
dst.copy_(src)
torch.cuda.synchronize(a); torch.cuda.synchronize(b)
rounds = 5
start = time.perf_counter()
for _ in range(rounds):
    dst.copy_(src)
torch.cuda.synchronize(a); torch.cuda.synchronize(b)
seconds = time.perf_counter() - start
got = int(dst.to(torch.int64).sum().item())
back = dst.to("cuda:%d" % a)
same = bool(got == want and torch.equal(back, src))
say(peer=peer, bytes=n, seconds=seconds / rounds, match=same)
"""
TRAY_PROBE = (
    "from PySide6.QtWidgets import QApplication, QSystemTrayIcon\n"
    "app = QApplication([])\n"
    "print('TRAY', QSystemTrayIcon.isSystemTrayAvailable())\n"
)


@dataclass(frozen=True)
class Finding:
    name: str
    state: str  # ok | warn | fail | info
    detail: str
    fix: str = ""
    blocks: bool = False  # serving cannot work until this is fixed


@dataclass(frozen=True)
class GPUFacts:
    """What NVML says (None driver: NVML did not load, ``error`` says why)."""

    driver: str | None
    cuda: str | None
    names: tuple[str, ...]
    memory_bytes: tuple[int, ...]
    p2p: tuple[tuple[int, int, bool], ...]  # (a, b, peer-to-peer reads work)
    error: str = ""


def read_gpus(lib: Any = None) -> GPUFacts:
    """NVML's view of the GPUs; ``lib`` is the pynvml module (tests pass a FAKE one)."""
    try:
        if lib is None:
            import pynvml

            lib = pynvml
        lib.nvmlInit()
    except Exception as exc:  # NVML raises its own error classes, or the library is missing
        return GPUFacts(None, None, (), (), (), error=f"{type(exc).__name__}: {exc}")
    try:
        driver = _text(lib.nvmlSystemGetDriverVersion())
        cuda_raw = int(lib.nvmlSystemGetCudaDriverVersion_v2())
        cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}"
        handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
        names = tuple(_text(lib.nvmlDeviceGetName(h)) for h in handles)
        memory = tuple(int(lib.nvmlDeviceGetMemoryInfo(h).total) for h in handles)
        p2p = []
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                status = lib.nvmlDeviceGetP2PStatus(handles[a], handles[b], P2P_CAPS_INDEX_READ)
                p2p.append((a, b, status == P2P_STATUS_OK))
        return GPUFacts(driver, cuda, names, memory, tuple(p2p))
    except Exception as exc:  # a driver that loads but answers errors (lost GPU, mismatch)
        return GPUFacts(None, None, (), (), (), error=f"{type(exc).__name__}: {exc}")
    finally:
        try:
            lib.nvmlShutdown()
        except Exception:  # noqa: S110 - nothing to undo when shutdown fails
            pass


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_findings(facts: GPUFacts, *, cpu_engine: bool) -> list[Finding]:
    if facts.driver is None:
        # no GPU is a way to run (the CPU build), not a fault: the engine is what to fix
        fix = "for GPU serving install the NVIDIA driver (`nvidia-smi` must work)"
        fix += (
            "; until then the CPU build serves small models"
            if cpu_engine
            else "; without one, the CPU build serves small models"
        )
        return [
            Finding(
                "NVIDIA driver", "warn", f"not found ({facts.error}): traylm serves on the CPU", fix
            ),
            Finding(
                "NVML",
                "warn",
                "not available: no GPU telemetry, fans or power limits",
                "comes with the NVIDIA driver",
            ),
        ]
    found = [Finding("NVIDIA driver", "ok", f"driver {facts.driver}")]
    major = int(facts.cuda.split(".")[0]) if facts.cuda else 0
    if major < CUDA_MIN_MAJOR:
        found.append(
            Finding(
                "CUDA",
                "fail",
                f"the driver supports CUDA {facts.cuda}",
                f"update the NVIDIA driver to one with CUDA {CUDA_MIN_MAJOR}.x",
                blocks=not cpu_engine,
            )
        )
    else:
        found.append(Finding("CUDA", "ok", f"the driver supports CUDA {facts.cuda}"))
    found.append(Finding("NVML", "ok", "telemetry, fan and power control available"))
    gpus = ", ".join(
        f"{n} ({m / GIB:.0f} GiB)" for n, m in zip(facts.names, facts.memory_bytes, strict=True)
    )
    if facts.names:
        found.append(Finding("GPUs", "ok", gpus))
    else:
        found.append(
            Finding(
                "GPUs", "warn", "the driver sees no GPU", "check the card's seat and power cables"
            )
        )
    for a, b, ok in facts.p2p:
        found.append(
            Finding(
                f"P2P GPU {a} ↔ {b}",
                "ok" if ok else "info",
                "peer-to-peer works: profiles may set p2p = true"
                if ok
                else "no peer-to-peer (stock GeForce driver): tensor parallel runs over PCIe with "
                "NCCL_P2P_DISABLE=1, as the presets do",
            )
        )
    return found


def p2p_transfer_finding(
    python: Path,
    a: int,
    b: int,
    *,
    timeout_s: float = P2P_TIMEOUT_S,
    mib: int = P2P_COPY_MIB,
    run: Callable[..., Any] = subprocess.run,
) -> Finding:
    """Copy ``mib`` MiB from GPU ``a`` to GPU ``b`` with the engine env's torch (``python``),
    checksum it, and time it, within ``timeout_s``: NVML's "P2P OK" is no proof (NCCL hangs on
    IOMMU/ACS-routed systems that report it). GPU numbers are NVML's (PCI bus order)."""
    name = f"P2P copy GPU {a} → {b}"
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [str(python), "-c", P2P_SCRIPT, str(a), str(b), str(mib)]
    hang_fix = (
        "tensor parallel across these cards would hang the same way: keep p2p = false "
        "(NCCL_P2P_DISABLE=1), and disable the IOMMU (kernel option iommu=pt, or off in "
        "the BIOS) or ACS on the PCIe switch, then run `traylm doctor` again"
    )
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        return Finding(name, "fail", f"the copy did not finish in {timeout_s:.0f} s", hang_fix)
    except OSError as exc:
        return Finding(
            name,
            "warn",
            f"could not run the engine env's python ({exc})",
            "reinstall the engine: `traylm engines install vllm`",
        )
    facts = None
    for line in (done.stdout or "").splitlines():
        if line.startswith(P2P_MARK):
            try:
                facts = json.loads(line[len(P2P_MARK) :])
            except ValueError:
                facts = None
    if not isinstance(facts, dict):
        tail = ((done.stderr or "").strip().splitlines() or ["no output"])[-1][:200]
        return Finding(name, "fail", f"the copy failed (exit {done.returncode}): {tail}", hang_fix)
    if "skipped" in facts:
        return Finding(name, "info", f"not tested: {facts['skipped']}")
    if not facts.get("match"):
        return Finding(name, "fail", "the data arrived changed (checksums differ)", hang_fix)
    seconds = float(facts.get("seconds") or 0.0)
    size = int(facts.get("bytes") or 0)
    rate = f"{size / seconds / 1e9:.1f} GB/s" if seconds > 0 else "too fast to time"
    how = "peer-to-peer" if facts.get("peer") else "through host memory (no peer access)"
    return Finding(name, "ok", f"{size >> 20} MiB copied {how} at {rate}; checksums match")


def p2p_transfer_findings(
    envs: list[EnvInfo], facts: GPUFacts, *, run: Callable[..., Any] = subprocess.run
) -> list[Finding]:
    """The copy test for each pair of GPUs, with the first complete CUDA engine env's torch."""
    if facts.driver is None or len(facts.names) < 2:
        return []
    env = next((e for e in envs if e.complete and e.device == "cuda"), None)
    if env is None:
        return [
            Finding(
                "P2P copy",
                "info",
                "not tested: no CUDA engine installed",
                "install one (`traylm engines install vllm`), then run the doctor again",
            )
        ]
    return [p2p_transfer_finding(env.python, a, b, run=run) for a, b, _ in facts.p2p]


def disk_finding(path: Path, free_bytes: int) -> Finding:
    where = f"{free_bytes / GIB:.1f} GiB free at {path}"
    if free_bytes < DISK_BLOCK_BYTES:
        return Finding(
            "disk",
            "fail",
            where,
            "free space there, or move the Hugging Face cache (HF_HOME) to a bigger disk",
            blocks=True,
        )
    if free_bytes < DISK_WARN_BYTES:
        return Finding(
            "disk", "warn", where, "enough for small models only; big ones need tens of GB"
        )
    return Finding("disk", "ok", where)


def disk_findings(paths: Paths) -> list[Finding]:
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    seen: set[int] = set()  # one line per file system
    found = []
    for path in (_existing(hf_home), _existing(paths.envs_dir)):
        if path.stat().st_dev not in seen:
            seen.add(path.stat().st_dev)
            found.append(disk_finding(path, shutil.disk_usage(path).free))
    return found


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def port_finding(
    settings: Settings, paths: Paths, holder: Callable[[str, int], str | None]
) -> Finding:
    port = settings.gateway.port
    who = holder(settings.bind_host, port)
    if who is None:
        return Finding("port", "ok", f"127.0.0.1:{port} is free for the gateway")
    daemon_pid = _daemon_pid(paths)
    if daemon_pid is not None and who.startswith(f"pid {daemon_pid} "):
        return Finding("port", "ok", f"127.0.0.1:{port} is the running traylm daemon's")
    return Finding(
        "port",
        "fail",
        f"127.0.0.1:{port} is held by {who}",
        f"stop it, or move traylm: `traylm config set gateway.port {port + 1}`",
        blocks=True,
    )


def ollama_port_finding(
    settings: Settings, paths: Paths, holder: Callable[[str, int], str | None]
) -> Finding:
    """Ollama's API port (ollama.port): held by another program (Ollama itself) is a warning,
    never a block: traylm serves :8000 as always, and apps that speak Ollama's API reach that
    program instead."""
    port = settings.ollama.port
    if not settings.ollama.enabled:
        return Finding("ollama port", "info", "Ollama's API is off (ollama.enabled)")
    who = holder(settings.bind_host, port)
    daemon_pid = _daemon_pid(paths)
    if who is None or (daemon_pid is not None and who.startswith(f"pid {daemon_pid} ")):
        return Finding("ollama port", "ok", f"127.0.0.1:{port} serves (or can serve) Ollama's API")
    return Finding(
        "ollama port",
        "warn",
        f"127.0.0.1:{port} is held by {who}: apps that speak Ollama's API reach it, not traylm",
        f"move traylm's with `traylm config set ollama.port {port + 1}` and point the apps "
        "there, or stop the other server (`systemctl stop ollama` for Ollama)",
    )


def _daemon_pid(paths: Paths) -> int | None:
    try:
        return int(json.loads(paths.daemon_json.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def env_findings(envs: list[EnvInfo], *, gpu: bool) -> list[Finding]:
    complete = [e for e in envs if e.complete]
    found = []
    for env in envs:
        if env.installing_pid:
            found.append(
                Finding(
                    f"engine {env.name}", "info", f"being installed now (pid {env.installing_pid})"
                )
            )
        elif not env.complete:
            found.append(
                Finding(
                    f"engine {env.name}",
                    "warn",
                    "its install did not finish",
                    f"`traylm engines install {env.engine}"
                    f"{' --cpu' if env.device == 'cpu' else ''}` again",
                )
            )
    usable = [e for e in complete if e.device == "cpu" or gpu]
    for env in complete:
        note = "" if env in usable else " (a CUDA build: needs the NVIDIA driver)"
        found.append(
            Finding(
                f"engine {env.name}", "ok" if not note else "warn", f"installed at {env.path}{note}"
            )
        )
    if not usable:
        cmd = "traylm engines install vllm" + ("" if gpu else " --cpu")
        found.append(
            Finding(
                "engines",
                "fail",
                "no engine that can run here is installed",
                f"`{cmd}` (or the setup in the tray app)",
                blocks=True,
            )
        )
    return found


async def helper_finding(settings: Settings) -> Finding:
    client = HelperClient(Path(settings.gpu.helper_socket), timeout_s=3.0)
    try:
        status = await client.refresh()
    finally:
        await client.stop()
    if status.available:
        return Finding("root helper", "ok", f"traylm-gpud {status.version} answers")
    return Finding(
        "root helper",
        "info",
        f"{status.detail.split(';')[0]}: fan curves and power limits are read-only",
        status.install_hint,
    )


def tray_finding(environ: dict[str, str], run: Callable[..., Any] = subprocess.run) -> Finding:
    if not (environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY")):
        return Finding(
            "tray",
            "info",
            "no graphical session here: the tray app cannot show",
            "run `traylm` from your desktop; the CLI and `traylm serve` work here",
        )
    try:
        out = run(
            [sys.executable, "-c", TRAY_PROBE],
            capture_output=True,
            text=True,
            timeout=20,
            env=environ,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("tray", "warn", f"could not ask Qt ({exc})")
    if "TRAY True" in out:
        return Finding("tray", "ok", "the desktop has a system tray")
    if "TRAY False" in out:
        return Finding(
            "tray",
            "info",
            "no system tray on this desktop: traylm opens as a window",
            "GNOME needs the AppIndicator extension for tray icons",
        )
    return Finding("tray", "warn", "Qt could not start here", "see `traylm -v` for why")


async def run_checks(paths: Paths, settings: Settings, *, nvml: Any = None) -> list[Finding]:
    envs = await asyncio.to_thread(EnvManager(paths.envs_dir).list)
    facts = await asyncio.to_thread(read_gpus, nvml)
    cpu_engine = any(e.complete and e.device == "cpu" for e in envs)
    findings = gpu_findings(facts, cpu_engine=cpu_engine)
    findings += await asyncio.to_thread(disk_findings, paths)
    findings.append(await asyncio.to_thread(port_finding, settings, paths, port_holder))
    findings.append(await asyncio.to_thread(ollama_port_finding, settings, paths, port_holder))
    findings += env_findings(envs, gpu=facts.driver is not None)
    findings += await asyncio.to_thread(p2p_transfer_findings, envs, facts)
    findings.append(await helper_finding(settings))
    findings.append(await asyncio.to_thread(tray_finding, dict(os.environ)))
    return findings


MARKS = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]", "info": "[info]"}


def add_parser(sub: Any) -> None:
    s = sub.add_parser("doctor", help="check that this computer can serve models, with fixes")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_doctor)


async def cmd_doctor(args: argparse.Namespace) -> int:
    paths = Paths.from_env()
    settings = await asyncio.to_thread(load_settings, paths.config_file)
    findings = await run_checks(paths, settings)
    blocked = [f for f in findings if f.blocks]
    if args.json:
        print(json.dumps({"ready": not blocked, "checks": [asdict(f) for f in findings]}, indent=1))
        return 1 if blocked else 0
    for f in findings:
        print(f"{MARKS[f.state]} {f.name}: {f.detail}")
        if f.fix and f.state != "ok":
            print(f"       fix: {f.fix}")
    if blocked:
        print(f"not ready to serve: fix {', '.join(f.name for f in blocked)} first")
        return 1
    print("ready to serve: `traylm` opens the tray app, `traylm start NAME --wait` serves a model")
    return 0

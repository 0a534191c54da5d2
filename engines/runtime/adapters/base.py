"""What every engine adapter provides, and the shared pieces they are built from.

Adapters are pure: given a profile and the installed engine's runtime facts they return the
argv and environment to launch, the readiness rule, and they classify log lines. They never
spawn, sleep or touch the disk; the supervisor and envs modules do that.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from packaging.version import Version

from engines.config.profiles import Profile
from engines.errors import ConfigError, UnknownFlagError
from engines.events.core import Diagnosis
from engines.runtime.adapters.memory import MemoryNeed
from engines.runtime.adapters.phases import PhaseRule
from engines.runtime.adapters.routeset import RouteSet


@dataclass(frozen=True)
class FlagSpec:
    takes_value: bool
    multiple: bool = False
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FlagSet:
    """The command-line flags one engine version accepts (its allow-list)."""

    engine: str
    version: str
    flags: Mapping[str, FlagSpec]
    underscores_equal_hyphens: bool = False
    """vLLM's FlexibleArgumentParser accepts --max_model_len for --max-model-len."""
    complete: bool = True
    """False for a shipped subset (the install-time probe writes the full list)."""

    @classmethod
    def from_json(cls, data: Mapping[str, object], *, underscores: bool = False) -> FlagSet:
        raw = data["flags"]
        assert isinstance(raw, Mapping)
        flags = {
            name: FlagSpec(
                takes_value=bool(spec["takes_value"]),
                multiple=bool(spec.get("multiple", False)),
                choices=tuple(spec["choices"]) if spec.get("choices") else None,
            )
            for name, spec in raw.items()
        }
        complete = bool(data.get("complete", True))
        return cls(str(data["engine"]), str(data["version"]), flags, underscores, complete)

    def normalise(self, flag: str) -> str:
        name = flag.split("=", 1)[0]
        if self.underscores_equal_hyphens and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        return name

    def check(self, argv: Sequence[str]) -> None:
        """Raise UnknownFlagError for the first flag this version does not accept, naming the
        nearest valid one; also checks values against a flag's choices."""
        i = 0
        while i < len(argv):
            token = argv[i]
            if not token.startswith("-"):
                raise UnknownFlagError(
                    f"{token!r} in extra flags is a value without a flag before it; write it as "
                    "'--flag', 'value' or '--flag=value'"
                )
            name = self.normalise(token)
            spec = self.flags.get(name)
            if spec is None and not self.complete:
                raise UnknownFlagError(
                    f"{name} is not in traylm's partial flag list for {self.engine} "
                    f"{self.version}; reinstall the environment (`traylm engines install "
                    f"{self.engine}`) so traylm can probe every flag the engine accepts"
                )
            if spec is None:
                close = difflib.get_close_matches(name, list(self.flags), n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise UnknownFlagError(
                    f"{self.engine} {self.version} does not accept {name}{hint} "
                    f"(see `traylm engines flags {self.engine}` for the accepted list)"
                )
            values: list[str] = []
            if "=" in token:
                values.append(token.split("=", 1)[1])
            elif spec.takes_value:
                while i + 1 < len(argv) and not _looks_like_flag(argv[i + 1]):
                    values.append(argv[i + 1])
                    i += 1
                    if not spec.multiple:
                        break
            for value in values:
                if spec.choices and value not in spec.choices:
                    raise UnknownFlagError(
                        f"{name} {value!r} is not accepted by {self.engine} {self.version}; "
                        f"valid: {', '.join(spec.choices)}"
                    )
            i += 1


def _looks_like_flag(token: str) -> bool:
    """'--x' and '-tp' are flags; '-1' (a negative number) is a value."""
    return token.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", token)


@dataclass(frozen=True)
class EngineRuntime:
    """Facts about one installed engine environment that a launch depends on."""

    engine: str
    version: Version
    python: Path
    bin_dir: Path
    device: str  # "cuda" | "cpu"
    flags: FlagSet
    routes: RouteSet | None = None
    """The HTTP routes the engine serves per model task; None when not recorded."""
    cache_dir: Path | None = None
    """traylm's cache folder for this engine environment (compile caches, per model below it);
    None leaves the engine's own default (tests that only build argv)."""
    compute_capability: str = ""
    """The oldest CUDA compute capability of the GPUs the engine runs on ("8.9"); "" when not
    known (no GPU inventory): checks that need it then assume nothing."""


RUN_DIR = "{run_dir}"
"""Placeholder in LaunchSpec.argv for the engine's run folder, where the supervisor writes
LaunchSpec.files before it spawns the engine (adapters are pure and never touch the disk)."""


@dataclass(frozen=True)
class SleepRoutes:
    """An engine's sleep-mode routes (vLLM with ``--enable-sleep-mode`` and
    ``VLLM_SERVER_DEV_MODE=1``): POST ``sleep_path`` frees its GPU memory (weights to host RAM),
    POST ``wake_path`` restores it, GET ``status_path`` says ``{"is_sleeping": bool}``. The
    gateway never forwards them; only the daemon calls them on the engine's loopback port."""

    sleep_path: str = "/sleep?level=1&mode=wait"
    wake_path: str = "/wake_up"
    status_path: str = "/is_sleeping"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the supervisor needs to start and probe one engine process."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    served_names: tuple[str, ...]
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str | None = "/metrics"
    metrics_format: str = "prometheus"
    files: Mapping[str, str] = field(default_factory=dict)
    """File name → text, written into the run folder (``RUN_DIR`` in argv) before spawning,
    e.g. TensorRT-LLM's --extra_llm_api_options YAML."""
    phases: tuple[PhaseRule, ...] = ()
    """The phases of a start in order, with the log lines that begin them (empty: the engine's
    log is not read for progress)."""
    links: Mapping[str, str] = field(default_factory=dict)
    """Symlink path → target folder, made (when missing) before spawning: caches that every
    model of one engine install shares, inside a per-model cache folder."""
    warm_argv: tuple[str, ...] = ()
    """A process that does this launch's slow imports ahead of time, then reads the launch's
    whole argv from stdin (one JSON line: {"argv": [...]}) and runs it (runtime/warm.py); empty
    when the engine cannot start that way."""
    sleep: SleepRoutes | None = None
    """Set when the engine runs with sleep mode (it can free its GPU memory while idle)."""


@dataclass(frozen=True)
class LogRule:
    """A regular expression over one log line and the diagnosis it means."""

    code: str
    pattern: re.Pattern[str]
    summary: str
    advice: str
    """Formatted with the match's named groups and with ``suggested``."""
    severity: str = "error"
    suggest: Callable[[re.Match[str]], Mapping[str, str]] = field(default=lambda m: {})

    def match(self, line: str) -> Diagnosis | None:
        m = self.pattern.search(line)
        if m is None:
            return None
        suggested = dict(self.suggest(m))
        values = {k: v for k, v in m.groupdict().items() if v is not None}
        return Diagnosis(
            code=self.code,
            summary=self.summary.format(**values, **suggested),
            advice=self.advice.format(**values, **suggested),
            severity=self.severity,
            line=line.strip()[:500],
            suggested=suggested,
        )


def first_diagnosis(rules: Sequence[LogRule], line: str) -> Diagnosis | None:
    for rule in rules:
        found = rule.match(line)
        if found is not None:
            return found
    return None


PORT_IN_USE = LogRule(
    "port_in_use",
    re.compile(r"\[Errno 98\]|Address already in use"),
    "The engine's port is already taken",
    "Another process took the port between traylm choosing it and the engine binding it; "
    "start the engine again (traylm picks a new free port each time).",
)


class EngineAdapter(Protocol):
    """One engine family (vLLM, TensorRT-LLM, SGLang)."""

    name: str
    """Registry key, the profile's ``engine`` value."""

    def launch(
        self, profile: Profile, *, runtime: EngineRuntime, port: int, model: str
    ) -> LaunchSpec:
        """argv and env for ``profile`` on loopback ``port``; ``model`` is the resolved model
        (a local folder or a repo id). Raises ConfigError/UnknownFlagError on a bad profile."""
        ...

    def diagnose(self, line: str) -> Diagnosis | None:
        """The diagnosis one (ANSI-stripped) log line means, if any."""
        ...

    def memory_need(
        self, profile: Profile, *, total_bytes: int, free_bytes: int, weights_bytes: int | None
    ) -> MemoryNeed:
        """What the engine takes on each of its GPUs by its own memory rule
        (engines/runtime/adapters/memory.py): ``total_bytes`` (as CUDA sees the card: NVML's
        total less the driver's reserve) and ``free_bytes`` of one card,
        ``weights_bytes`` of the whole model (None when unknown)."""
        ...


def weights_per_gpu(profile: Profile, weights_bytes: int | None) -> int | None:
    """The weights one GPU holds: tensor and pipeline parallel split them."""
    return None if weights_bytes is None else -(-weights_bytes // max(1, profile.world_size))


def tp_env(profile: Profile) -> dict[str, str]:
    """Environment for the profile's GPUs: visible devices and, without P2P on GeForce,
    NCCL's peer-to-peer off for any engine on more than one GPU (tensor, pipeline or data
    parallel: NCCL hangs otherwise)."""
    env: dict[str, str] = {}
    if profile.device != "cpu":
        if profile.gpus_auto:
            raise ConfigError(
                f"profile {profile.name!r} has gpus = 'auto', which is placed when the model "
                "loads: load it with `traylm load NAME` (or name the GPUs in the profile)"
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in profile.gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if max(profile.world_size, profile.gpu_count) > 1 and not profile.p2p:
            env["NCCL_P2P_DISABLE"] = "1"
    return env

"""Engine profiles: one way to run one model with one engine, stored as
``profiles/<name>.toml`` next to the shipped presets (resources/profiles, read-only).

Each field has one default and one doc line (``config.fields.doc``), the form's tooltip. Loading
validates everything and raises ``ConfigError`` listing each problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.config.fields import (
    build_dataclass,
    did_you_mean,
    non_default,
    problems_message,
    setting,
)
from engines.config.replica_ids import MAX_REPLICAS as MAX_REPLICAS  # re-exported
from engines.config.replica_ids import REPLICA_SEP as REPLICA_SEP
from engines.config.replica_ids import replica_base as replica_base
from engines.config.replica_ids import replica_id as replica_id
from engines.config.replica_ids import replica_index as replica_index
from engines.config.sections import resources_dir
from engines.config.tomlfile import read_toml, write_toml_atomic
from engines.errors import ConfigError, ProfileNotFound, quoted

ENGINES = ("vllm", "trtllm", "sglang")
"""Engine names a profile may use (the adapter registry has one adapter per name)."""
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
"""The form of a profile name: also of engine ids, model folders and attached servers."""
MAX_NAME_CHARS = 256
"""The longest model name a profile (model, served_name, aliases) or a request may give; a repo
id is at most 193 characters, a local folder's path rarely longer."""
AUTO = "auto"
ACROSS_BOXES_WARNING = (
    "vLLM's traffic between the boxes (torch.distributed, Gloo/NCCL) is unencrypted and "
    "unauthenticated, and whoever reaches its ports can make the ranks run code: traylm binds "
    "it to the interface the boxes share; use it only on a private network (a cable or a "
    "switch you trust), never across the internet"
)
"""Said wherever a model across boxes (``Profile.boxes``) is turned on: the profile's save,
its preflight (`traylm spread check`) and every start's log."""


def valid_name(name: object) -> bool:
    """True when ``name`` is a valid profile name (``NAME_RULE``); the whole text must match,
    so a trailing newline does not pass."""
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def check_name(name: str, what: str = "profile") -> str:
    """``name`` when it is a valid profile name; otherwise ConfigError (HTTP 400, code
    ``invalid_name``) that says the rule. ``what``: the kind of name, for the message."""
    if not valid_name(name):
        raise ConfigError(
            f"{quoted(name)} is not a valid {what} name: use {NAME_RULE} (no spaces, '/' or "
            "other signs)",
            code="invalid_name",
        )
    return name


@dataclass(frozen=True)
class Profile:
    """One way to run one model with one engine. Stored as ``profiles/<name>.toml``."""

    name: str = setting("", "Profile name (the file name without .toml).")
    engine: str = setting("vllm", "Inference engine.", choices=ENGINES)
    model: str = setting("", "Hugging Face repo id (org/name) or a local model folder.")
    revision: str | None = setting(None, "Model revision (commit sha, branch or tag).")
    served_name: str | None = setting(
        None, "Model name clients send in `model` (default: the repo's name part)."
    )
    aliases: tuple[str, ...] = setting((), "More names the gateway routes to this engine.")
    description: str = setting("", "A line shown in menus.")
    device: str = setting(
        "auto",
        "cuda, cpu, or auto (cuda when an NVIDIA GPU is present).",
        choices=("auto", "cuda", "cpu"),
    )
    gpus: tuple[int, ...] = setting(
        (0,),
        'CUDA device indices the engine may use, or "auto": the planner picks the card(s) '
        "when the model loads (one card, the one with the most room; both for tensor parallel).",
    )
    tensor_parallel_size: int = setting(1, "Tensor-parallel size (GPUs per model copy).", min=1)
    pipeline_parallel_size: int = setting(1, "Pipeline-parallel size.", min=1)
    replicas: int = setting(
        1,
        "Copies of the model behind its one name, each its own engine (one per GPU when each "
        "copy fits one card; host RAM each on the CPU): requests go to the least busy copy.",
        min=1,
        max=MAX_REPLICAS,
    )
    data_parallel_size: int = setting(
        1,
        "vLLM's own data parallel (--data-parallel-size): copies inside one engine, where the "
        "installed version has the flag.",
        min=1,
    )
    boxes: tuple[str, ...] = setting(
        (),
        "One model across boxes (vLLM multi-node): the paired boxes (`traylm peers`) that run "
        "the model's later pipeline stages, in order; this box runs the first and serves it. "
        "pipeline_parallel_size = 1 + their count; tensor parallel stays inside each box. "
        "vLLM's traffic between the boxes is unencrypted and unauthenticated: use it only on a "
        "network you trust.",
    )
    p2p: bool = setting(
        False,
        "GPUs support peer-to-peer (patched driver). Off: NCCL P2P and custom all-reduce "
        "are disabled, which stock-driver GeForce cards need for tensor parallel.",
    )
    dtype: str = setting(
        "auto", "Weight/activation dtype.", choices=("auto", "float16", "bfloat16", "float32")
    )
    quantization: str | None = setting(None, "Quantization method (awq, gptq, fp8, ...).")
    kv_cache_dtype: str = setting(
        "auto",
        "KV-cache dtype (fp8 halves KV memory on Ada).",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    )
    max_model_len: int | None = setting(
        None, "Context length in tokens (default: model's).", min=16
    )
    max_num_seqs: int | None = setting(None, "Most sequences batched at once.", min=1)
    max_num_batched_tokens: int | None = setting(None, "Token budget per scheduler step.", min=16)
    gpu_memory_utilization: float = setting(
        0.90, "Fraction of each GPU's memory the engine may take.", min=0.05, max=1.0
    )
    mem_fraction_static: float | None = setting(
        None,
        "SGLang only: --mem-fraction-static, the share of the memory free at launch for weights "
        "and KV cache (the rest is for activations and CUDA graphs). Empty: SGLang's own choice "
        "for the card (about 0.83 on a 24 GB card). vLLM and TensorRT-LLM use "
        "gpu_memory_utilization instead.",
        min=0.05,
        max=1.0,
    )
    cpu_kv_cache_gib: int | None = setting(
        None, "KV cache for the CPU build, in whole GiB (default: engines.cpu_kv_cache_gib).", min=1
    )
    trust_remote_code: bool = setting(
        False, "Run the model repo's own Python code. Only for models you trust."
    )
    runner: str = setting(
        "auto",
        "vLLM: what the model runs as: generate (chat, completions, responses), pooling "
        "(embeddings, scores, rerank), or auto (from the model's architecture).",
        choices=("auto", "generate", "pooling"),
    )
    tool_parser: str = setting(
        "",
        "How the engine reads tool calls in the model's output (vLLM's --tool-call-parser): "
        "llama3_json for Llama 3.x, hermes for Qwen 2.5/3, mistral for Mistral. Empty: off.",
        label="Tool calling format",
        suggestions=("llama3_json", "hermes", "mistral", "qwen3_coder", "pythonic"),
    )
    reasoning_parser: str = setting(
        "",
        "How the engine separates the model's thinking from its answer (vLLM's "
        "--reasoning-parser): qwen3 for Qwen3, deepseek_r1 for DeepSeek-R1. Empty: off.",
        label="Reasoning (thinking) format",
        suggestions=("qwen3", "deepseek_r1", "mistral"),
    )
    engine_version: str | None = setting(
        None, "Installed engine version to use (default: the newest installed)."
    )
    mode: str = setting(
        "serve",
        "TensorRT-LLM only: serve (PyTorch backend) or build (compiled engine).",
        choices=("serve", "build"),
    )
    quant_recipe: str | None = setting(
        None, "TensorRT-LLM build: ModelOpt recipe (fp8, int4_awq, w4a8_awq) or none."
    )
    calib_dataset: str | None = setting(
        None,
        "TensorRT-LLM build: a local folder with the calibration dataset for ModelOpt's "
        "quantize.py (--calib_dataset); default: cnn_dailymail, downloaded from the Hub.",
    )
    max_batch_size: int | None = setting(None, "TensorRT-LLM: maximum batch size.", min=1)
    extra_flags: tuple[str, ...] = setting(
        (), "More engine flags, checked against the installed version's allow-list."
    )
    env: dict[str, str] = setting({}, "Extra environment variables for the engine process.")
    idle_ttl_s: float | None = setting(
        None,
        "Unload the model after this many seconds without requests (0: never; default: "
        "engines.idle_ttl_s).",
        min=0,
    )
    sleep_mode: bool = setting(
        True,
        "vLLM on CUDA: start with sleep mode, so that when another model needs the GPU this one "
        "can move its weights to host RAM and wake in seconds instead of a cold start.",
    )

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.effective_served_name, *self.aliases)

    @property
    def effective_served_name(self) -> str:
        if self.served_name:
            return self.served_name
        return self.model.rstrip("/").rsplit("/", 1)[-1] or self.name

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        """The GPUs (ranks) this box runs: with ``boxes`` each box runs one pipeline stage."""
        return self.tensor_parallel_size if self.boxes else self.world_size

    @property
    def gpu_count(self) -> int:
        """GPUs one engine of this profile takes: tensor × pipeline parallel (this box's
        stage, with ``boxes``), times vLLM's own data parallel."""
        return self.local_world_size * self.data_parallel_size

    @property
    def gpus_auto(self) -> bool:
        """``gpus = "auto"`` (held as no indices): placed when the model loads."""
        return not self.gpus


def profile_from_mapping(name: str, data: Mapping[str, Any], where: str = "") -> Profile:
    problems: list[str] = []
    values = {**dict(data), "name": name}
    if values.get("gpus") == AUTO:
        values["gpus"] = ()
    profile = build_dataclass(Profile, values, "", problems)
    problems.extend(_check_profile(profile))  # also with field errors: report everything at once
    if problems:
        raise ConfigError(problems_message(where or f"profile '{name}'", problems))
    return profile


def profile_to_mapping(profile: Profile) -> dict[str, Any]:
    data = non_default(profile)
    data.pop("name", None)
    if profile.gpus_auto:
        data["gpus"] = AUTO
    return data


def _check_profile(p: Profile) -> list[str]:
    problems: list[str] = []
    if not valid_name(p.name):
        problems.append(f"name {quoted(p.name)} must be {NAME_RULE} (no spaces or '/')")
    if not p.model:
        problems.append("model is required: a Hugging Face repo id (org/name) or a local folder")
    for key, value in (("model", p.model), ("served_name", p.served_name or "")):
        if len(value) > MAX_NAME_CHARS:
            problems.append(f"{key} {quoted(value)} is longer than {MAX_NAME_CHARS} characters")
    problems.extend(
        f"aliases: {quoted(a)} is longer than {MAX_NAME_CHARS} characters"
        for a in p.aliases
        if len(a) > MAX_NAME_CHARS
    )
    if p.gpu_count > len(p.gpus) and p.device != "cpu" and not p.gpus_auto:
        problems.append(
            f"tensor × pipeline × data parallel = {p.gpu_count} needs that many GPUs, "
            f"but gpus lists {len(p.gpus)}: set gpus = {list(range(p.gpu_count))}"
            if not p.boxes
            else f"tensor_parallel_size = {p.tensor_parallel_size} needs that many GPUs on each "
            f"box, but gpus lists {len(p.gpus)}: set gpus = {list(range(p.local_world_size))}"
        )
    problems.extend(_check_boxes(p))
    if len(set(p.gpus)) != len(p.gpus) or any(g < 0 for g in p.gpus):
        problems.append(f"gpus {list(p.gpus)} must be distinct non-negative CUDA indices")
    if p.replicas > 1 and len(replica_id(p.name, p.replicas)) > 64:
        problems.append(
            f"replicas = {p.replicas} names engines {replica_id(p.name, p.replicas)!r}: "
            "shorten the profile name to at most 60 characters"
        )
    if p.boxes and (p.replicas > 1 or p.data_parallel_size > 1):
        problems.append(
            "a model across boxes (boxes) runs as one copy: set replicas and "
            "data_parallel_size to 1, or serve it on one box with replicas"
        )
    if p.data_parallel_size > 1 and p.engine != "vllm":
        problems.append(
            f"data_parallel_size is vLLM's own data parallel; for engine = {p.engine!r} use "
            "replicas instead"
        )
    if p.device == "cpu" and p.local_world_size > 1:
        problems.append("the CPU build runs without tensor/pipeline parallel: set both to 1")
    if p.mode == "build" and p.engine != "trtllm":
        problems.append("mode = 'build' is for engine = 'trtllm' only")
    for key in p.env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            problems.append(f"env key {key!r} is not a valid environment variable name")
    for key in ("tool_parser", "reasoning_parser"):
        value = getattr(p, key)
        if value and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", value):
            problems.append(f"{key} {value!r} is not a parser name (letters, digits, '_', '-')")
        elif value and p.engine != "vllm":
            problems.append(f"{key} is a vLLM setting; leave it empty for engine = {p.engine!r}")
    if p.runner != "auto" and p.engine != "vllm":
        problems.append(f"runner is a vLLM setting; leave it 'auto' for engine = {p.engine!r}")
    if p.extra_flags and not p.extra_flags[0].startswith("-"):
        problems.append(f"extra_flags must start with a flag (--name), not {p.extra_flags[0]!r}")
    return problems


def _check_boxes(p: Profile) -> list[str]:
    """A model across boxes: vLLM's multi-node launch, one pipeline stage per box."""
    if not p.boxes:
        return []
    problems = [
        f"boxes: {b!r} is not a box name ({NAME_RULE})" for b in p.boxes if not valid_name(b)
    ]
    if len(set(p.boxes)) != len(p.boxes):
        problems.append(f"boxes {list(p.boxes)} names a box twice")
    if p.engine != "vllm":
        problems.append("boxes (one model across boxes) is for engine = 'vllm' only")
    if p.pipeline_parallel_size != 1 + len(p.boxes):
        problems.append(
            f"with {len(p.boxes)} other box(es) set pipeline_parallel_size = {1 + len(p.boxes)}: "
            "one pipeline stage per box (tensor parallel stays inside a box)"
        )
    return problems


class ProfileStore:
    """Profiles in ``profiles/*.toml``; shipped presets (resources/profiles) are read-only."""

    def __init__(self, profiles_dir: Path, presets_dir: Path | None = None) -> None:
        self._dir = profiles_dir
        self._presets = presets_dir if presets_dir is not None else resources_dir() / "profiles"

    def names(self) -> list[str]:
        names = {p.stem for p in self._presets.glob("*.toml")}
        if self._dir.is_dir():
            names |= {p.stem for p in self._dir.glob("*.toml")}
        return sorted(names)

    def is_preset(self, name: str) -> bool:
        return (
            not (self._dir / f"{name}.toml").exists() and (self._presets / f"{name}.toml").exists()
        )

    def load(self, name: str) -> Profile:
        if not valid_name(name):
            raise ProfileNotFound(f"no profile named {quoted(name)}: names are {NAME_RULE}")
        for folder in (self._dir, self._presets):
            path = folder / f"{name}.toml"
            if path.exists():
                return profile_from_mapping(name, read_toml(path), str(path))
        raise ProfileNotFound(
            f"no profile named {quoted(name)}{did_you_mean(name, self.names())}; "
            "list them with `traylm profiles`"
        )

    def load_all(self) -> tuple[list[Profile], list[str]]:
        """Every loadable profile, and one error line for each broken file."""
        good: list[Profile] = []
        broken: list[str] = []
        for name in self.names():
            try:
                good.append(self.load(name))
            except ConfigError as exc:
                broken.append(exc.message)
        return good, broken

    def save(self, profile: Profile) -> Path:
        problems = _check_profile(profile)
        if problems:
            raise ConfigError(problems_message(f"profile '{profile.name}'", problems))
        path = self._dir / f"{profile.name}.toml"
        write_toml_atomic(path, profile_to_mapping(profile))
        return path

    def delete(self, name: str) -> None:
        path = self._dir / f"{check_name(name)}.toml"
        if not path.exists():
            if (self._presets / f"{name}.toml").exists():
                raise ConfigError(f"{name!r} is a shipped preset and cannot be deleted")
            raise ProfileNotFound(f"no profile named {quoted(name)}")
        path.unlink()

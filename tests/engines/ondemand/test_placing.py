"""The Placer on two simulated RTX 4090s without a daemon: a library model with ``gpus =
"auto"`` runs on one GPU when the fit estimate says it fits there, else on both (TP 2); the
placed profile carries the GPUs and the tensor-parallel size it will run with."""

from __future__ import annotations

from engines.config.profiles import profile_from_mapping
from engines.config.sections import Settings
from engines.gpu.sim import SimulatedBackend
from engines.ondemand.catalog import IMPLICIT, Entry
from engines.ondemand.lifecycle import Lifecycle
from engines.ondemand.placing import Placer
from engines.runtime.supervisor import Supervisor
from tests.engines.hub.test_fit import LLAMA_8B, details


class FixedSettings:
    current = Settings()

    def subscribe(self, listener: object) -> None:
        pass


async def no_wait(after_s: float) -> None:
    """The GPU samples here are fixed: none is newer than another."""


def placer() -> Placer:
    supervisor = Supervisor()
    idle = lambda engine_id: (0, 0, None)  # noqa: E731
    lifecycle = Lifecycle(
        engines=supervisor,
        start_engine=None,  # type: ignore[arg-type]  (nothing starts here)
        place=None,  # type: ignore[arg-type]
        settings=FixedSettings(),
        publish=lambda event: None,
        activity=idle,
    )
    p = Placer(
        settings=FixedSettings(),
        engines=supervisor,
        lifecycle=lifecycle,
        latest=lambda: (),
        sample_after=no_wait,
        activity=idle,
    )
    p.infos = SimulatedBackend(2).open()
    return p


def library_entry(name: str, model_details) -> Entry:
    profile = profile_from_mapping(
        name, {"model": "/models/" + name, "device": "cuda", "gpus": "auto", "max_model_len": 8192}
    )
    return Entry(
        f"org/{name}",
        "library",
        name,
        ((f"org/{name}", IMPLICIT),),
        profile=profile,
        weights_bytes=model_details.weights_bytes,
        details=model_details,
    )


def test_a_model_that_fits_one_card_takes_one_and_a_bigger_one_takes_both() -> None:
    p = placer()
    small = p.preview(library_entry("small", LLAMA_8B))
    assert small.fits and small.gpus == (0,)
    # 21 GB of weights (a 4-bit 32 B model with its embeddings unquantized) leave one 24 GB
    # card no room for 8k tokens of KV cache even with vLLM's 2048-token profiling run; split
    # over two it fits (vLLM's own rule would have let it start on one and fail)
    awq_32b = details(
        weights_bytes=21_000_000_000,
        num_layers=64,
        hidden_size=5120,
        intermediate_size=27648,
        num_attention_heads=40,
        quantization="awq",
    )
    big = p.preview(library_entry("big", awq_32b))
    assert big.fits and big.gpus == (0, 1)

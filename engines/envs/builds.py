"""Which build of an engine runs on this computer's NVIDIA driver, and the pip steps it takes.

Pure functions over (engine, device, version, the driver's CUDA version): no I/O. The driver's
CUDA version is the newest CUDA its libcuda runs (NVML's nvmlSystemGetCudaDriverVersion_v2,
nvidia-smi's "CUDA Version"); a build made for a newer CUDA dies in torch's CUDA init. What
upstream publishes:

- vLLM 0.33/0.34 on PyPI pull torch 2.14 from PyPI, built for CUDA 13.0 (driver 580 or newer).
  The same release is on its GitHub release page as a CUDA 12.9 wheel (``+cu129``), installed
  with PyTorch's cu129 index (vLLM's docs, "GPU installation": "We also provide vLLM binaries
  compiled with CUDA 12.8, 13.0..." and the release-wheel URL pattern). FlashInfer's
  precompiled kernels (flashinfer-cubin, and flashinfer-jit-cache per CUDA version) for the
  FlashInfer vLLM pins come from FlashInfer's index: without them FlashInfer compiles at start,
  which needs nvcc (vLLM's ``vllm download-kernels`` installs the same).
- TensorRT-LLM 1.2 wheels are built against torch 2.9.1 for CUDA 13.0: NVIDIA's install guide
  installs that torch from PyTorch's cu130 index first, then the wheel.
- SGLang 0.5.23 pulls PyPI's torch 2.14 (CUDA 13.0).

Older drivers get no build: :func:`choose_build` refuses, naming the driver needed, before
anything is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from engines.core.cuda_drivers import MIN_DRIVER
from engines.errors import EngineEnvError
from engines.events.gpu import GPUInfo

PYTORCH_INDEX = "https://download.pytorch.org/whl/{tag}"
FLASHINFER_INDEX = "https://flashinfer.ai/whl"
VLLM_RELEASE_WHEEL = (
    "https://github.com/vllm-project/vllm/releases/download/v{version}/"
    "vllm-{version}+{tag}-cp38-abi3-manylinux_2_28_x86_64.whl"
)
NVIDIA_INDEX = "https://pypi.nvidia.com"
DRIVER_DOWNLOAD = "https://www.nvidia.com/drivers"


@dataclass(frozen=True)
class PipStep:
    """One ``pip install``: its packages and the indexes it reads."""

    packages: tuple[str, ...]
    index_url: str = ""
    """Replaces PyPI for this step ("" = PyPI)."""
    extra_index_urls: tuple[str, ...] = ()
    engine: bool = False
    """The step that installs the engine itself (its pip progress is the install's)."""
    optional: bool = False
    """The engine runs without it (slower to start): a failure is reported, not fatal."""

    def urls(self) -> list[str]:
        """Where it downloads from, besides PyPI (the indexes, and wheels given by URL)."""
        wheels = [p for p in self.packages if p.startswith("https://")]
        return [*filter(None, [self.index_url]), *self.extra_index_urls, *wheels]

    def args(self) -> list[str]:
        """pip's arguments after ``install``."""
        out = list(self.packages)
        if self.index_url:
            out += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            out += ["--extra-index-url", url]
        return out


@dataclass(frozen=True)
class Build:
    """The build of one engine version chosen for this driver."""

    engine: str
    device: str
    version: str
    cuda: str
    """The CUDA the build is made for ("" for the CPU build)."""
    steps: tuple[PipStep, ...]
    reason: str
    """Why this build, in words."""

    @property
    def min_driver(self) -> str:
        """The oldest driver that runs it ("" for the CPU build)."""
        return MIN_DRIVER.get(self.cuda, "")

    @property
    def tag(self) -> str:
        """The build's name: "cu130", "cu129" or "cpu"."""
        return "cu" + self.cuda.replace(".", "") if self.cuda else "cpu"


@dataclass(frozen=True)
class _Line:
    """What upstream publishes for a release line: each CUDA, newest first, with its steps."""

    cudas: tuple[str, ...]
    torch: str = ""
    flashinfer: str = ""


_VLLM = {  # the torch and flashinfer-python each release's wheel pins (its metadata)
    "0.33": _Line(("13.0", "12.9"), torch="2.14.0", flashinfer="0.7.2.post1"),
    "0.34": _Line(("13.0", "12.9"), torch="2.14.0", flashinfer="0.7.3"),
}
_TRTLLM = {"1.2": _Line(("13.0",), torch="2.9.1")}
_SGLANG = {"0.5": _Line(("13.0",))}


def driver_cuda(gpus: Sequence[GPUInfo]) -> str:
    """The CUDA version this computer's driver runs ("" when NVML does not say)."""
    return next((g.cuda_version for g in gpus if g.cuda_version), "")


def choose_build(engine: str, version: str, cuda: str) -> Build:
    """The CUDA build of ``engine`` ``version`` for a driver that runs CUDA ``cuda`` ("" =
    unknown: the newest build, and the doctor says what it needs). Raises EngineEnvError when
    upstream publishes none that runs on this driver."""
    line = _line(engine, version)
    if line is None:  # a release traylm has no table for: PyPI's wheel, checked by the doctor
        step = PipStep((f"{_DIST[engine]}=={version}",), "", _extra(engine), engine=True)
        reason = f"PyPI's build (traylm does not know which CUDA {_name(engine)} {version} needs)"
        return Build(engine, "cuda", version, "", (step,), reason)
    runnable = [c for c in line.cudas if not cuda or _cuda_key(c) <= _cuda_key(cuda)]
    if not runnable:
        oldest = line.cudas[-1]
        raise EngineEnvError(
            f"{_name(engine)} {version} has no build that runs on this driver (it runs CUDA "
            f"{cuda} at most; the oldest build needs CUDA {oldest}, driver {MIN_DRIVER[oldest]} "
            f"or newer). Update the NVIDIA driver ({DRIVER_DOWNLOAD}, or your distribution's "
            "driver packages), then install again; nothing was downloaded.",
            brief=f"{_name(engine)} {version} needs driver {MIN_DRIVER[oldest]} or newer",
        )
    chosen = runnable[0]
    steps = _cuda_steps(engine, version, chosen, line)
    if not cuda:
        reason = "the newest; NVML did not say which CUDA the driver runs"
    elif chosen == line.cudas[0]:
        reason = f"the newest, and the driver runs CUDA {cuda}"
    else:
        reason = (
            f"the driver runs CUDA {cuda}, too old for the CUDA {line.cudas[0]} build "
            f"(driver {MIN_DRIVER[line.cudas[0]]} or newer)"
        )
    return Build(engine, "cuda", version, chosen, steps, reason)


def pip_commands(build: Build, python: str = "python") -> list[str]:
    """Every step as the command line it runs, for printing."""
    return [" ".join([python, "-m", "pip", "install", *s.args()]) for s in build.steps]


_DIST = {"vllm": "vllm", "trtllm": "tensorrt_llm", "sglang": "sglang"}


def _extra(engine: str) -> tuple[str, ...]:
    return (NVIDIA_INDEX,) if engine == "trtllm" else ()


def _cuda_steps(engine: str, version: str, cuda: str, line: _Line) -> tuple[PipStep, ...]:
    tag = "cu" + cuda.replace(".", "")
    torch_index = PYTORCH_INDEX.format(tag=tag)
    if engine == "trtllm":
        return (
            PipStep((f"torch=={line.torch}", "torchvision"), index_url=torch_index),
            PipStep(
                (f"tensorrt_llm=={version}",),
                extra_index_urls=(NVIDIA_INDEX, torch_index),
                engine=True,
            ),
        )
    if engine == "sglang":
        return (PipStep((f"sglang=={version}",), engine=True),)
    kernels = PipStep(
        (f"flashinfer-cubin=={line.flashinfer}", f"flashinfer-jit-cache=={line.flashinfer}"),
        extra_index_urls=(FLASHINFER_INDEX, f"{FLASHINFER_INDEX}/{tag}"),
        optional=True,
    )
    if cuda == line.cudas[0]:  # PyPI's wheel and its torch
        return PipStep((f"vllm=={version}",), engine=True), kernels
    wheel = VLLM_RELEASE_WHEEL.format(version=version, tag=tag)
    return (
        PipStep((f"torch=={line.torch}",), index_url=torch_index),
        PipStep((wheel,), extra_index_urls=(torch_index,), engine=True),
        kernels,
    )


def _line(engine: str, version: str) -> _Line | None:
    lines = {"vllm": _VLLM, "trtllm": _TRTLLM, "sglang": _SGLANG}.get(engine)
    if lines is None:
        raise EngineEnvError(f"traylm cannot install {engine}; it knows vllm, trtllm and sglang")
    try:
        v = Version(version)
    except InvalidVersion:
        raise EngineEnvError(f"{version!r} is not a release number (e.g. 0.34.0)") from None
    return lines.get(f"{v.major}.{v.minor}")


def _cuda_key(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor.partition(".")[0] or 0)
    except ValueError:
        return 0, 0


def _name(engine: str) -> str:
    return {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang"}.get(engine, engine)

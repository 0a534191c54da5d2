"""What vLLM makes of a model (task and parsers), the route lists per version, and the presets'
parsers, checked against the names vLLM 0.32's registries hold (recorded in the shipped flag
list by the install-time probe)."""

from __future__ import annotations

import pytest

from engines.config.profiles import ProfileStore, profile_from_mapping
from engines.config.sections import resources_dir
from engines.envs.manager import load_flags, load_routes
from engines.runtime.adapters.vllm_models import Parsers, family_parsers, model_tasks


def tasks(archs: list[str], **fields: object) -> set[str]:
    p = profile_from_mapping("p", {"model": "org/m", **fields})
    return set(model_tasks(p, archs))


def test_tasks_follow_vllms_architecture_suffixes_and_the_runner() -> None:
    assert tasks(["LlamaForCausalLM"]) == {"generate"}
    assert tasks(["Qwen2VLForConditionalGeneration"]) == {"generate"}
    assert tasks(["BertModel"]) == {"embed"}
    assert tasks(["XLMRobertaForSequenceClassification"]) == {"classify"}
    assert tasks(["WhisperForConditionalGeneration"]) == {"transcription"}
    assert tasks(["LlamaForCausalLM"], runner="pooling") == {"embed"}
    assert tasks(["BertModel"], runner="generate") == {"generate"}
    p = profile_from_mapping("p", {"model": "org/m"})
    assert model_tasks(p, ["Qwen3ForCausalLM"], sentence_transformers=True) == {"embed"}


@pytest.mark.parametrize(
    ("model", "config", "expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", None, Parsers(tool="llama3_json")),
        ("casperhansen/llama-3.3-70b-instruct-awq", None, Parsers(tool="llama3_json")),
        (
            "/models/my-llama",
            {"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}},
            Parsers(tool="llama3_json"),
        ),
        ("Qwen/Qwen2.5-32B-Instruct-AWQ", None, Parsers(tool="hermes")),
        ("/models/q", {"model_type": "qwen2"}, Parsers(tool="hermes")),
        ("Qwen/Qwen3-8B", None, Parsers(tool="hermes", reasoning="qwen3")),
        ("/models/q3", {"model_type": "qwen3_moe"}, Parsers(tool="hermes", reasoning="qwen3")),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", None, Parsers(tool="qwen3_coder")),
        ("mistralai/Mistral-7B-Instruct-v0.3", None, Parsers(tool="mistral")),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", None, Parsers(reasoning="deepseek_r1")),
        ("/models/tiny", {"model_type": "llama"}, Parsers()),  # Llama 2 style: no tools
        ("google/gemma-2-9b-it", None, Parsers()),
    ],
)
def test_family_parsers(model: str, config: dict[str, object] | None, expected: Parsers) -> None:
    assert family_parsers(model, config) == expected


def test_every_parser_traylm_fills_in_exists_in_vllm_0_32() -> None:
    flags = load_flags("vllm", "0.32.0").flags
    tool = set(flags["--tool-call-parser"].choices or ())
    reasoning = set(flags["--reasoning-parser"].choices or ())
    assert {"llama3_json", "hermes", "mistral", "qwen3_coder", "pythonic"} <= tool
    assert {"qwen3", "deepseek_r1", "mistral"} <= reasoning
    presets, broken = ProfileStore(resources_dir() / "profiles").load_all()
    assert not broken and presets
    for preset in presets:
        assert preset.tool_parser in tool, preset.name
        assert preset.tool_parser == family_parsers(preset.model).tool, preset.name


def test_the_shipped_route_list_mounts_routes_by_task() -> None:
    routes = load_routes("vllm", "0.32.0")
    assert routes is not None and routes.version == "0.32.0"
    assert routes.serves("POST", "/v1/responses", ["generate"])
    assert routes.serves("GET", "/v1/responses/{response_id}", ["generate"])
    assert routes.serves("POST", "/v1/messages/count_tokens", ["generate"])
    assert not routes.serves("POST", "/v1/embeddings", ["generate"])
    assert routes.serves("POST", "/v1/embeddings", ["embed"])
    assert routes.tasks_serving("POST", "/v1/audio/transcriptions") == ("transcription",)
    assert set(routes.tasks_serving("POST", "/v1/rerank")) >= {"embed", "classify"}
    assert routes.serves("POST", "/tokenize")  # every task
    assert not routes.serves("POST", "/v1/nothing")
    assert load_routes("vllm", "9.9.9") is None  # unknown version: the gateway forwards

"""Ollama library tags traylm knows the Hugging Face repo of: a pull of ``llama3.1:8b`` is
refused (traylm serves Hub checkpoints, not Ollama's GGUF blobs) with the repo to pull instead."""

from __future__ import annotations

HUB_REPOS = {
    "llama3.1:8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama3.1:70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama3.2:1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama3.2:3b": "meta-llama/Llama-3.2-3B-Instruct",
    "llama3.3:70b": "meta-llama/Llama-3.3-70B-Instruct",
    "qwen2.5:0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2.5:1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2.5:7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-coder:7b": "Qwen/Qwen2.5-Coder-7B-Instruct",
    "qwen3:0.6b": "Qwen/Qwen3-0.6B",
    "qwen3:4b": "Qwen/Qwen3-4B",
    "qwen3:8b": "Qwen/Qwen3-8B",
    "mistral:7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "gemma3:1b": "google/gemma-3-1b-it",
    "gemma3:4b": "google/gemma-3-4b-it",
    "gemma3:12b": "google/gemma-3-12b-it",
    "phi3:mini": "microsoft/Phi-3-mini-4k-instruct",
    "phi4:14b": "microsoft/phi-4",
    "nomic-embed-text:latest": "nomic-ai/nomic-embed-text-v1.5",
}
DEFAULT_TAGS = {"llama3.1": "8b", "llama3.2": "3b", "qwen2.5": "7b", "qwen3": "8b"}


def hub_repo_for(tag: str) -> str | None:
    """The Hub repo of an Ollama library tag ("llama3.1:8b", "llama3.1", "mistral"), or None."""
    name, _, size = tag.partition(":")
    size = size or DEFAULT_TAGS.get(name, "latest")
    return HUB_REPOS.get(f"{name}:{size}") or next(
        (repo for key, repo in HUB_REPOS.items() if key.split(":")[0] == name and not size), None
    )


def refusal(tag: str) -> str:
    """What a pull of an Ollama library tag is told."""
    repo = hub_repo_for(tag)
    base = (
        f"{tag!r} is an Ollama library tag; traylm serves Hugging Face models (name a Hub repo "
        "id, org/name)"
    )
    if repo is not None:
        return f"{base}: pull {repo!r} instead (`traylm models pull {repo}`)"
    return base + ", e.g. Qwen/Qwen2.5-0.5B-Instruct"

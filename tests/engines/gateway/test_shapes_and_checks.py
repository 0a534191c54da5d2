"""The gateway's pure parts for the newer APIs: error shapes, body checks, the engine's terse
errors explained, the bounded response-id map, and API keys from either header."""

from __future__ import annotations

import json

from aiohttp import web

from engines.config.sections import GatewaySettings
from engines.core.http import openai_error
from engines.core.procs import free_loopback_port
from engines.envs.manager import load_routes
from engines.gateway.capabilities import Capabilities, explain_engine_error
from engines.gateway.checks import check_anthropic, check_openai
from engines.gateway.response_owners import ResponseOwners
from engines.gateway.security import Guard, hash_key
from engines.gateway.shapes import api_error, as_anthropic, error_message

G = GatewaySettings()


def caps(**fields: object) -> Capabilities:
    base: dict[str, object] = {
        "engine_id": "qwen",
        "profile": "qwen",
        "label": "vllm 0.32.0",
        "routes": load_routes("vllm", "0.32.0"),
        "tasks": None,
        "architectures": (),
        "tool_parser": "",
        "suggested_tool_parser": "hermes",
        "checks_tools": True,
        "stores_responses": False,
    }
    return Capabilities(**{**base, **fields})  # type: ignore[arg-type]


def body(resp: web.Response) -> dict[str, object]:
    assert isinstance(resp.body, bytes)
    data: dict[str, object] = json.loads(resp.body)
    return data


def test_errors_take_the_shape_of_the_path_they_answer() -> None:
    anthropic = body(api_error("/v1/messages", 429, "slow down", type_="rate_limit_exceeded"))
    assert anthropic == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    openai = body(api_error("/v1/chat/completions", 429, "slow down", type_="rate_limit_exceeded"))
    assert openai["error"] == {
        "message": "slow down",
        "type": "rate_limit_exceeded",
        "param": None,
        "code": 429,
    }
    assert body(api_error("/v1/messages/count_tokens", 503, "x"))["error"] == {
        "type": "api_error",  # a 503 that names no wait is not an overload (not retried)
        "message": "x",
    }
    busy = api_error("/v1/messages", 503, "x", headers={"Retry-After": "30"})
    assert body(busy)["error"] == {"type": "overloaded_error", "message": "x"}


def test_engine_errors_in_any_shape_become_anthropic_ones() -> None:
    fastapi = web.json_response(
        {"detail": [{"loc": ["body", "max_tokens"], "msg": "Field required"}]}, status=400
    )
    assert body(as_anthropic(fastapi))["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required",
    }
    relayed = openai_error(502, "engine x did not answer", headers={"Retry-After": "2"})
    converted = as_anthropic(relayed)
    assert converted.headers["Retry-After"] == "2"
    assert body(converted)["error"] == {"type": "api_error", "message": "engine x did not answer"}
    already = web.json_response(
        {"type": "error", "error": {"type": "not_found_error", "message": "y"}}, status=404
    )
    assert as_anthropic(already) is already
    # vLLM's translate_error_response: Anthropic's shape, its own exception name as the type
    vllm = web.json_response(
        {"type": "error", "error": {"type": "BadRequestError", "message": "y"}}, status=400
    )
    assert body(as_anthropic(vllm))["error"] == {"type": "invalid_request_error", "message": "y"}
    assert error_message(b"not json") is None


def test_anthropic_bodies_refuse_openai_only_fields() -> None:
    hi = [{"role": "user", "content": "hi"}]
    ok = {"model": "m", "max_tokens": 5, "messages": hi}
    assert check_anthropic(ok, G, count_tokens=False) is None
    field, why = check_anthropic({**ok, "response_format": {}}, G, count_tokens=False) or ("", "")
    assert field == "response_format" and "use output_config.format instead" in why
    field, why = check_anthropic({**ok, "max_completion_tokens": 5}, G, count_tokens=False) or (
        "",
        "",
    )
    assert field == "max_completion_tokens" and "use max_tokens instead" in why
    assert check_anthropic({"model": "m", "messages": hi}, G, count_tokens=True) is None
    assert check_anthropic({"model": "m", "messages": hi}, G, count_tokens=False) == (
        "max_tokens",
        "'max_tokens' is required: the most tokens to generate (1 or more)",
    )
    assert check_anthropic({**ok, "messages": []}, G, count_tokens=False)[0] == "messages"  # type: ignore[index]
    assert check_openai({"model": "m", "n": 99}, G)[0] == "n"  # type: ignore[index]
    assert check_openai({"model": "m", "input": "x"}, G) is None


def test_vllms_tool_choice_error_is_explained_with_the_profile_setting() -> None:
    engine = web.json_response(
        {
            "error": {
                "message": '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
        status=400,
    )
    out = explain_engine_error(
        caps(),
        engine,
        method="POST",
        route="/v1/chat/completions",
        path="/v1/chat/completions",
        model="qwen",
    )
    message = body(out)["error"]["message"]  # type: ignore[index]
    assert "Set tool_parser = \"hermes\" in profile 'qwen'" in message
    other = web.json_response({"error": {"message": "bad temperature"}}, status=400)
    assert (
        explain_engine_error(caps(), other, method="POST", route="/", path="/", model="m") is other
    )


def test_the_bare_404_names_the_kind_of_model_when_it_is_known() -> None:
    bare = web.json_response({"detail": "Not Found"}, status=404)
    known = caps(tasks=frozenset({"generate"}), architectures=("Qwen2ForCausalLM",))
    out = explain_engine_error(
        known, bare, method="POST", route="/v1/score", path="/v1/score", model="qwen"
    )
    message = body(out)["error"]["message"]  # type: ignore[index]
    assert "'qwen' is a text-generation model (Qwen2ForCausalLM)" in message
    assert 'runner = "pooling"' in message


def test_response_owners_keep_the_newest_ids() -> None:
    owners = ResponseOwners(limit=3)
    for i in range(5):
        owners.record("e1", f'{{"id": "resp_{i}", "object": "response"}}'.encode(), caller="a")
    owners.record(
        "e2",
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_9"}}\n\n',
        caller="a",
    )
    owners.record("e2", b'{"id": "msg_1"}', caller="a")  # not a response id
    assert len(owners) == 3
    assert owners.engine_for("resp_0", "a") is None and owners.engine_for("resp_4", "a") == "e1"
    assert owners.engine_for("resp_9", "a") == "e2"
    assert owners.engine_for("resp_9", "b") is None  # another caller's: as if unknown


def test_callers_are_the_key_or_this_computer() -> None:
    keys = Guard.build(
        hosts=(),
        origins=(),
        key_digests=(hash_key("k1"), hash_key("k2")),
        port=free_loopback_port(),
        lan=True,
    )
    a = keys.caller("Bearer k1", None, remote="10.0.0.2", local=False)
    assert a == keys.caller(None, "k1", remote="127.0.0.1", local=True)  # the key, not where
    assert a != keys.caller("Bearer k2", None, remote="10.0.0.2", local=False)
    open_ = Guard.build(hosts=(), origins=(), key_digests=(), port=free_loopback_port(), lan=False)
    here = open_.caller(None, None, remote="127.0.0.1", local=True)
    assert here == open_.caller("Bearer whatever", None, remote="::1", local=True)
    assert here != open_.caller(None, None, remote="10.0.0.2", local=False)
    assert open_.caller(None, None, remote="10.0.0.2", local=False) != open_.caller(
        None, None, remote="10.0.0.3", local=False
    )


def test_api_keys_from_bearer_or_x_api_key() -> None:
    guard = Guard.build(
        hosts=(), origins=(), key_digests=(hash_key("k1"),), port=free_loopback_port(), lan=False
    )
    assert guard.key_ok("Bearer k1") and guard.key_ok(None, "k1")
    assert not guard.key_ok(None, "k2") and not guard.key_ok(None, None)
    assert not guard.key_ok("Bearer wrong", "k1")  # a Bearer header is the key that counts
    assert not guard.key_ok(None, "  ")

"""Dump the command-line flags an installed engine accepts, as JSON on stdout.

Run with the ENGINE venv's Python (never imported by traylm itself):
    python argparse_flags.py vllm | sglang | trtllm | trtllm-build
    python argparse_flags.py script PATH NAME     (an argparse script such as quantize.py)
It builds the engine's real parser (argparse, or click for trtllm-serve) and lists every option
string, whether it takes a value, and its choices. traylm stores the result as the engine
version's flag allow-list.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import runpy
import sys
from typing import Any


def _vllm_parser() -> argparse.ArgumentParser:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    for module in (
        "vllm.entrypoints.common.cli_args",  # 0.34
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.openai.cli_args",
    ):
        try:
            make = importlib.import_module(module).make_arg_parser
        except (ImportError, AttributeError):
            continue
        return make(FlexibleArgumentParser())
    raise SystemExit("cannot find vLLM's make_arg_parser in this version")


def _vllm_parser_choices(flags: dict[str, dict[str, object]]) -> None:
    """vLLM leaves --tool-call-parser and --reasoning-parser open in argparse (plugins can add
    names) and keeps the built-in names in two registries: record those as the choices."""
    registries = {
        "--tool-call-parser": ("vllm.tool_parsers", "ToolParserManager"),
        "--reasoning-parser": ("vllm.reasoning", "ReasoningParserManager"),
    }
    for flag, (module, manager) in registries.items():
        if flag not in flags:
            continue
        try:
            names = getattr(importlib.import_module(module), manager).list_registered()
        except (ImportError, AttributeError):  # an older layout: leave the flag open
            continue
        flags[flag]["choices"] = sorted(str(n) for n in names)


def _vllm_typed_choices(flags: dict[str, dict[str, object]]) -> None:
    """Some of vLLM's flags take any string in argparse while its config types name the values
    (a Literal, or the quantization registry); record those as the choices where argparse has
    none, so a profile's value renamed or removed between versions is refused before a start."""
    from typing import get_args

    sources = {
        "--quantization": ("vllm.model_executor.layers.quantization", "QUANTIZATION_METHODS"),
        "--kv-cache-dtype": ("vllm.config.cache", "CacheDType"),
        "--tokenizer-mode": ("vllm.config.model", "TokenizerMode"),
    }
    for flag, (module, name) in sources.items():
        if flag not in flags or flags[flag].get("choices"):
            continue
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # another layout: leave the flag open
            continue
        names = found if isinstance(found, list | tuple) else get_args(found)
        if names:
            flags[flag]["choices"] = sorted(str(n) for n in names)


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _trtllm_build_parser() -> argparse.ArgumentParser:
    from tensorrt_llm.commands.build import parse_arguments

    parser: argparse.ArgumentParser = parse_arguments()
    return parser


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def _script_parser(path: str) -> argparse.ArgumentParser:
    """Run a script as __main__ until it parses its arguments, and keep that parser."""

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    sys.argv = [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except _Captured as found:
        return found.parser
    raise SystemExit(f"{path} finished without parsing its arguments")


def _describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, object]]:
    flags: dict[str, dict[str, object]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for opt in action.option_strings:
            choices = [str(c) for c in action.choices if c is not None] if action.choices else None
            flags[opt] = {
                "takes_value": action.nargs != 0,
                "multiple": action.nargs in ("+", "*", argparse.REMAINDER),
                "choices": choices,
                "dest": action.dest,
            }
    return flags


def _describe_click(command: Any) -> dict[str, dict[str, object]]:
    import click

    flags: dict[str, dict[str, object]] = {}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        choices = list(param.type.choices) if isinstance(param.type, click.Choice) else None
        for opt in (*param.opts, *param.secondary_opts):
            flags[opt] = {
                "takes_value": not param.is_flag,
                "multiple": param.nargs == -1,
                "choices": [str(c) for c in choices] if choices else None,
                "dest": param.name,
            }
    return flags


def installed_version(*dists: str) -> str | None:
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def main() -> None:
    # Engines print banners on import (TensorRT-LLM prints its version to stdout): keep stdout
    # for the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        data = _probe(sys.argv[1])
    json.dump(data, sys.stdout, indent=1, sort_keys=True)


def _probe(what: str) -> dict[str, object]:
    style = "argparse"
    if what == "trtllm":
        from tensorrt_llm.commands.serve import serve

        flags, style = _describe_click(serve), "click"
        engine, version = "trtllm", installed_version("tensorrt_llm", "tensorrt-llm")
    elif what == "trtllm-build":
        flags = _describe(_trtllm_build_parser())
        engine, version = "trtllm-build", installed_version("tensorrt_llm", "tensorrt-llm")
    elif what == "script":
        path, engine = sys.argv[2], sys.argv[3]
        flags = _describe(_script_parser(path))
        version = installed_version("tensorrt_llm", "tensorrt-llm")
    else:
        parser = {"vllm": _vllm_parser, "sglang": _sglang_parser}[what]()
        flags, engine, version = _describe(parser), what, installed_version(what, f"{what}-cpu")
        if what == "vllm":
            _vllm_parser_choices(flags)
            _vllm_typed_choices(flags)
    return {"engine": engine, "version": version, "style": style, "flags": flags}


if __name__ == "__main__":
    main()

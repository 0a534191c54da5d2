"""Dump the command-line flags an installed engine accepts, as JSON on stdout.

Run with the ENGINE venv's Python (never imported by traylm itself):
    python argparse_flags.py vllm
It builds the engine's real argparse parser and lists every option string, whether it takes a
value, and its choices. traylm stores the result as the engine version's flag allow-list.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys


def _vllm_parser() -> argparse.ArgumentParser:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    for module in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make = importlib.import_module(module).make_arg_parser
        except (ImportError, AttributeError):
            continue
        return make(FlexibleArgumentParser())
    raise SystemExit("cannot find vLLM's make_arg_parser in this version")


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, object]]:
    flags: dict[str, dict[str, object]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for opt in action.option_strings:
            flags[opt] = {
                "takes_value": action.nargs != 0,
                "multiple": action.nargs in ("+", "*", argparse.REMAINDER),
                "choices": [str(c) for c in action.choices] if action.choices else None,
                "dest": action.dest,
            }
    return flags


def main() -> None:
    engine = sys.argv[1]
    parser = {"vllm": _vllm_parser, "sglang": _sglang_parser}[engine]()
    from importlib import metadata

    version = None
    for dist in (engine, f"{engine}-cpu"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    json.dump(
        {"engine": engine, "version": version, "flags": _describe(parser)},
        sys.stdout,
        indent=1,
        sort_keys=True,
    )


if __name__ == "__main__":
    main()

"""Every command, option and positional of `traylm` says what it is for in `--help`.

The whole parser is walked (every subcommand, at every depth), as `build_parser()` makes it
without running anything; the Commands page of the docs is generated from the same walk.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator

import pytest

from engines.cli import build_parser


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("traylm",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, dict[str, str | None]]]:
    """(command words, parser, the help its parent gives each of its subcommands)."""
    yield path, parser, {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) in seen:  # an alias (`list` of `ls`): the same parser again
                    continue
                seen.add(id(child))
                yield from (
                    (p, c, helps if p == (*path, name) else h)
                    for p, c, h in _parsers(child, (*path, name))
                )


def _name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or action.dest


def test_every_option_and_positional_has_help() -> None:
    missing = []
    for path, parser, _ in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(path)} {_name(action)}")
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_every_subcommand_has_help() -> None:
    missing = []
    for path, _parser, sibling_help in _parsers(build_parser()):
        if len(path) > 1 and not (sibling_help.get(path[-1]) or "").strip():
            missing.append(" ".join(path))
    assert not missing, "subcommands without help text:\n" + "\n".join(missing)


def test_the_walk_reaches_nested_subcommands() -> None:
    """The walk itself: a test that finds nothing to check would pass for nothing."""
    paths = {" ".join(p) for p, _, _ in _parsers(build_parser())}
    assert {"traylm engines upgrade", "traylm engines cache rm", "traylm models set"} <= paths
    assert len(paths) > 60


def _help_text(words: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser(words[0] if words else None).parse_args([*words, "--help"])
    return out.getvalue()


def test_no_literal_markup_in_help() -> None:
    """Docstrings written for Sphinx (``name``) read as noise in a terminal."""
    for path, parser, _ in _parsers(build_parser()):
        text = parser.format_help()
        assert "``" not in text, f"{' '.join(path)} --help shows literal markup"
    assert _help_text(["tune"]).split("\n\n")[1].startswith("traylm tune: find")


def test_start_names_profile_or_folder() -> None:
    assert "[PROFILE|FOLDER]" in _help_text(["start"])


@pytest.mark.parametrize(
    ("words", "alias"),
    [
        ("engines ls", "engines list"),
        ("engines rm vllm", "engines remove vllm"),
        ("engines cache ls", "engines cache list"),
        ("engines cache rm e1", "engines cache remove e1"),
        ("keys ls", "keys list"),
        ("keys rm abc", "keys remove abc"),
        ("models ls", "models list"),
        ("models rm org/m", "models remove org/m"),
        ("bench ls", "bench list"),
        ("bench rm 3", "bench remove 3"),
        ("requests ls", "requests list"),
    ],
)
def test_ls_and_rm_take_list_and_remove_as_aliases(words: str, alias: str) -> None:
    parser = build_parser()
    canonical, aliased = parser.parse_args(words.split()), parser.parse_args(alias.split())
    assert canonical.func is aliased.func and vars(canonical) == vars(aliased)

"""Tests mirror the tree: each test file sits in the folder that mirrors the package or module it
tests (tests/engines/gateway/ for engines/gateway/, tests/engines/cli/ for engines/cli.py), or in
one of the folders of tests that cut across the tree. A new test flat in tests/engines/ fails
here, and so does a test folder without an ``__init__.py`` (two ``test_cli.py`` would collide)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Folders whose tests are about no single package: a real daemon with a real engine, benchmarks,
# scripts for a real GPU box, the docs, the fakes.
CROSS_CUTTING = ("integration", "perf", "gpu", "docs", "fakes")
# Test folders that mirror a code folder of the same name.
MIRRORED = ("engines", "desktop")
# The desktop app's tests are not split by package yet: files directly in tests/desktop/ pass.
FLAT_ALLOWED = ("desktop",)


def _mirrors(root: Path, folders: tuple[str, ...]) -> bool:
    code = root.joinpath(*folders)
    return code.is_dir() or code.with_name(code.name + ".py").is_file()


def _problem(root: Path, folders: tuple[str, ...]) -> str | None:
    if not folders or folders[0] in CROSS_CUTTING:
        return None
    if folders[0] not in MIRRORED:
        return f"tests/{folders[0]}/ mirrors no code folder and is not a cross-cutting one"
    if len(folders) == 1 and folders[0] not in FLAT_ALLOWED:
        return f"flat in tests/{folders[0]}/: move it to the folder of the package it tests"
    if not _mirrors(root, folders):
        return f"{'/'.join(folders)} is neither a package nor a module: name the folder after one"
    return None


def misplaced(root: Path) -> list[str]:
    """Each test file under ``root/tests`` that mirrors no package or module of the code under
    ``root``, and each test folder without an ``__init__.py``, with what is wrong."""
    tests = root / "tests"
    wrong = []
    for path in sorted(tests.rglob("test_*.py")):
        folders = path.relative_to(tests).parts[:-1]
        problem = _problem(root, folders)
        if problem is not None:
            wrong.append(f"{path.relative_to(root)}: {problem}")
        for depth in range(1, len(folders) + 1):
            init = tests.joinpath(*folders[:depth], "__init__.py")
            if not init.is_file():
                wrong.append(f"{path.relative_to(root)}: {init.relative_to(root)} is missing")
    return sorted(set(wrong))


def test_every_test_file_mirrors_the_tree() -> None:
    assert misplaced(ROOT) == []


def _tree(root: Path, files: list[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


def test_a_flat_test_and_an_unmirrored_folder_are_named(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        [
            "engines/__init__.py",
            "engines/cli.py",
            "engines/gateway/__init__.py",
            "tests/__init__.py",
            "tests/engines/__init__.py",
            "tests/engines/test_new.py",
            "tests/engines/gateway/__init__.py",
            "tests/engines/gateway/test_proxy.py",
            "tests/engines/cli/__init__.py",
            "tests/engines/cli/test_help.py",
            "tests/engines/gatway/__init__.py",
            "tests/engines/gatway/test_typo.py",
            "tests/engines/hub/test_no_init.py",
            "tests/integration/__init__.py",
            "tests/integration/test_real_engine.py",
            "tests/test_root.py",
        ],
    )
    assert misplaced(root) == [
        "tests/engines/gatway/test_typo.py: engines/gatway is neither a package nor a module:"
        " name the folder after one",
        "tests/engines/hub/test_no_init.py: engines/hub is neither a package nor a module:"
        " name the folder after one",
        "tests/engines/hub/test_no_init.py: tests/engines/hub/__init__.py is missing",
        "tests/engines/test_new.py: flat in tests/engines/: move it to the folder of the package"
        " it tests",
    ]

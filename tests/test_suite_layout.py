"""The test suite's own layout: no test file imports another test file (shared fakes and helpers live
in plain modules: tests/fakes.py, tests/mpi_cases.py, tests/cuda_harness.py, fixtures in
tests/conftest.py), and no test file is named for a mutation round (tests are filed by the module
they test: docs/MUTATION.md)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(path: Path) -> list[str]:
    """The modules named test_* (or tests.test_*) that the file at `path` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "importorskip", "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]          # pytest.importorskip("test_x"), importlib.import_module(...)
        found += [n for n in names if n.split(".")[-1].startswith("test_") or n.startswith("tests.test_")]
    return found


def test_no_test_file_imports_another():
    offenders = {p.name: m for p in sorted(TESTS.glob("*.py")) if (m := imported_test_modules(p))}
    assert offenders == {}, offenders


def test_the_import_check_sees_both_forms(tmp_path):
    """Positive control: `from test_x import y`, `import tests.test_x`, a nested import and
    `pytest.importorskip("test_x")` are found."""
    f = tmp_path / "test_a.py"
    f.write_text("import os\nfrom test_b import c\ndef f():\n    import tests.test_d\n"
                 "    e = pytest.importorskip('test_e')\n    g = importlib.import_module('os')\n")
    assert sorted(imported_test_modules(f)) == ["test_b", "test_e", "tests.test_d"]


def test_no_file_is_named_for_a_mutation_round():
    assert sorted(p.name for p in TESTS.glob("test_mutants*.py")) == []

"""The executor stands alone: the measuring tools around it import it, never the reverse."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The one allowed arrow back: `python -m real.testbed --check` is a command-line shortcut to the study.
CLI_SHORTCUTS = {ROOT / "real" / "testbed" / "__main__.py"}


def imported(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (lazy imports count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def offending(files, forbidden: tuple[str, ...]) -> dict[str, set[str]]:
    found = {}
    for path in files:
        bad = {m for m in imported(path) if m.split(".")[0] == "studies" or m.startswith(forbidden)}
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_executor_modules_import_neither_the_testbed_nor_the_studies():
    executor = list((ROOT / "real").glob("*.py"))
    assert executor, "no executor modules found"
    assert offending(executor, ("real.testbed",)) == {}


def test_testbed_modules_do_not_import_the_studies():
    testbed = [p for p in (ROOT / "real" / "testbed").glob("*.py") if p not in CLI_SHORTCUTS]
    assert len(testbed) >= 3
    assert offending(testbed, ()) == {}


def test_simulator_imports_no_real_or_studies_module():
    files = list((ROOT / "syncsim").rglob("*.py"))
    found = {str(p.relative_to(ROOT)): {m for m in imported(p) if m.split(".")[0] in ("real", "studies")}
             for p in files}
    assert {k: v for k, v in found.items() if v} == {}

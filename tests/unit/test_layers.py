"""The arrows between the layers run one way (docs/architecture.md, "Layout").

syncsim/ (the simulator and what every executor shares) is the bottom; real/ (the torch.distributed
executor and its tools) builds on it; studies/ (programs that write results) build on both; paper/
reads the studies' results. A module may import from its own layer and the layers below, never
above: every import is read from the source (ast), at top level or inside a function, relative
imports resolved, so a lazy import breaks the rule as much as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each layer and the layers above it, which it must not import.
ABOVE = {
    "syncsim": ("real", "studies", "paper"),
    "real": ("studies", "paper"),
    "studies": ("paper",),
}


def module_name(path: Path, root: Path = ROOT) -> str:
    """``syncsim/convergence/replay.py`` -> ``syncsim.convergence.replay`` (a package's __init__ -> the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, anywhere in the file, relative imports made absolute."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # one dot: this package; each further dot: one package up
                parts = package.split(".")
                base = parts[:len(parts) - (node.level - 1)]
                names.add(".".join(base + ([node.module] if node.module else [])))
            else:
                names.add(node.module)
    return names


def crossings(layer: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of ``layer`` that imports from a layer above it, with what it imports."""
    found = {}
    for path in sorted((root / layer).rglob("*.py")):
        bad = {name for name in imports(path, root) if name.split(".")[0] in ABOVE[layer]}
        if bad:
            found[str(path.relative_to(root))] = bad
    return found


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_layer_imports_nothing_from_the_layers_above_it(layer):
    assert list((ROOT / layer).rglob("*.py")), f"no modules under {layer}/"
    assert crossings(layer) == {}


def test_relative_and_lazy_imports_count(tmp_path):
    # neither a relative import nor one inside a function is a way around the rule
    package = tmp_path / "syncsim" / "inner"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from . import sibling\n")
    (package / "mod.py").write_text("from .. import engine\nfrom ..schemes import spec\n\n\n"
                                    "def f():\n    import real.x\n")
    assert imports(package / "__init__.py", tmp_path) == {"syncsim.inner"}
    assert imports(package / "mod.py", tmp_path) == {"syncsim", "syncsim.schemes", "real.x"}
    assert crossings("syncsim", tmp_path) == {"syncsim/inner/mod.py": {"real.x"}}


def test_the_executor_modules_import_nothing_of_the_tools_around_them():
    # real/'s own modules (the executor, its worker, server and hooks) run on a GPU cluster without the
    # testbed, the calibration or the validation library; those import the executor, never the reverse
    executor = sorted((ROOT / "real").glob("*.py"))
    assert len(executor) >= 10, "no executor modules found"
    tools = ("real.testbed", "real.calibration", "real.validation")
    found = {str(p.relative_to(ROOT)): {m for m in imports(p) if m.startswith(tools)} for p in executor}
    allowed = {"real/calibrate.py"}  # the user calibration's command line, kept where users run it from
    assert {k: v for k, v in found.items() if v and k not in allowed} == {}


# Small modules of one noun, functions that fit on a screen (docs/development.md): the project's own bounds.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 50


def source_modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for layer in (*ABOVE, "paper") for p in (root / layer).rglob("*.py"))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """The functions of ``path`` longer than ``limit`` lines, their docstrings not counted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if ast.get_docstring(node, clean=False) is not None:
                lines -= node.body[0].end_lineno - node.body[0].lineno + 1
            if lines > limit:
                found.append(f"{node.name} ({lines} lines)")
    return found


def test_no_module_is_longer_than_the_bound():
    modules = source_modules()
    assert len(modules) > 50
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_longer_than_the_bound(tmp_path):
    found = {str(p.relative_to(ROOT)): f for p in source_modules() if (f := long_functions(p))}
    assert found == {}
    # the count leaves the docstring out and nothing else
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f'def f():\n    """A\n    docstring."""\n{body}\n')
    assert long_functions(tmp_path / "m.py") == ["f (51 lines)"]


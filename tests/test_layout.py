"""The layout the code promises, read from its syntax trees (no import runs).

Each subpackage is used through its face: another package imports what an ``__init__``
re-exports, never a ``_private`` module of it (a package's own modules, and those of the packages
inside it, may). Private names (``_name``) are imported only within their own package. No
function in product code runs over 60 lines, its signature and body counted, its docstring not
(the Args/Returns/Raises and example a public call owes its users are not code to split). The
subpackages import each other without a cycle, lazy imports included (those under
``TYPE_CHECKING`` never run), so each layer can be read, and imported, without the ones above it.
"""

from __future__ import annotations

import ast
import collections
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

PRODUCT = ("tuner", "objectives", "storage")
MAX_FUNCTION_LINES = 60

LONG_BY_DESIGN = {
    ("tuner/_tune.py", "tune"): "one keyword per study flag, each passed on to StudyConfig",
}
"""Functions whose length is a list, with why. The test fails once one is short, so the list
only ever names functions that need it."""


def _modules() -> Iterator[tuple[str, str, Path]]:
    """(module name, its package, path) of every product module."""
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            package = ".".join(parts[:-1])
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), package, path


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``, which never run."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            guarded.update(id(child) for part in node.body for child in ast.walk(part))
    return guarded


def _imports(path: Path, runtime: bool = False) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) of every import of a product module in ``path``, lazy ones too
    (with ``runtime``, not those under ``TYPE_CHECKING``); ``name`` is what a ``from`` import
    takes (None for ``import x``, or where it is a module)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PRODUCT:
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PRODUCT:
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if _is_module(submodule):
                    yield node.lineno, submodule, None
                else:
                    yield node.lineno, node.module, alias.name


def _private_owner(module: str) -> str | None:
    """The package whose private module ``module`` is, or None for a public path."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:index])
    return None


def _inside(package: str, owner: str) -> bool:
    return package == owner or package.startswith(owner + ".")


def test_no_module_imports_another_packages_private_module() -> None:
    wrong = []
    for _, package, path in _modules():
        where = path.relative_to(ROOT)
        for line, module, name in _imports(path):
            owner = _private_owner(module)
            if owner is not None and not _inside(package, owner):
                wrong.append(f"{where}:{line}: {module} is {owner}'s private module")
            if name is not None and name.startswith("_") and not name.startswith("__"):
                home = (
                    module
                    if (ROOT / module.replace(".", "/")).is_dir()
                    else module[: module.rfind(".")]
                )
                if package != home:
                    wrong.append(f"{where}:{line}: {module}.{name} is private to {home}")
    assert not wrong, "import through the face (the package's __init__):\n" + "\n".join(wrong)


def _function_lengths() -> Iterator[tuple[str, str, int]]:
    """(path, function name, lines from its ``def`` to its last line less its docstring's)."""
    for _, _, path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if ast.get_docstring(node, clean=False) is not None:
                    docstring = node.body[0]
                    assert docstring.end_lineno is not None
                    lines -= docstring.end_lineno - docstring.lineno + 1
                yield str(path.relative_to(ROOT)), node.name, lines


def test_no_function_runs_over_60_lines() -> None:
    lengths = list(_function_lengths())
    too_long = [
        f"{path}: {name} has {lines} lines"
        for path, name, lines in lengths
        if lines > MAX_FUNCTION_LINES and (path, name) not in LONG_BY_DESIGN
    ]
    assert not too_long, "split these:\n" + "\n".join(too_long)
    short_now = [
        f"{path}: {name}"
        for path, name, lines in lengths
        if (path, name) in LONG_BY_DESIGN and lines <= MAX_FUNCTION_LINES
    ]
    assert not short_now, "now short, remove from LONG_BY_DESIGN:\n" + "\n".join(short_now)


def _unit(module: str) -> str:
    """What the cycle check compares: a subpackage (``tuner.trial``), a top-level module of
    ``tuner`` (``tuner._attrs``), or a top package (``objectives``, ``storage``, ``tuner``)."""
    parts = module.split(".")
    if parts[0] != "tuner" or len(parts) == 1:
        return parts[0]
    return f"tuner.{parts[1]}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the units along it, or None."""
    state: dict[str, int] = collections.defaultdict(int)  # 0 new, 1 on the path, 2 done
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        path.append(unit)
        for child in sorted(graph.get(unit, ())):
            if state[child] == 1:
                return [*path[path.index(child) :], child]
            if state[child] == 0 and (found := visit(child)) is not None:
                return found
        path.pop()
        state[unit] = 2
        return None

    for unit in sorted(graph):
        if state[unit] == 0 and (found := visit(unit)) is not None:
            return found
    return None


def test_subpackages_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, _, path in _modules():
        for _, module, _ in _imports(path, runtime=True):
            if _unit(module) != _unit(name):
                graph[_unit(name)].add(_unit(module))
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_see_the_imports_they_judge() -> None:
    """The walk finds lazy imports and resolves ``from package import module``."""
    imports = set(_imports(ROOT / "tuner" / "insight" / "_best.py"))
    assert any(module == "tuner.machine" and name is None for _, module, name in imports)
    lazy = {module for _, module, _ in _imports(ROOT / "tuner" / "_cli.py")}
    assert {"tuner.insight", "tuner.run"} <= lazy
    face = ROOT / "tuner" / "__init__.py"
    assert "tuner.insight" in {module for _, module, _ in _imports(face)}
    assert "tuner.insight" not in {module for _, module, _ in _imports(face, runtime=True)}
    assert _private_owner("tuner.search._settings") == "tuner.search"
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None

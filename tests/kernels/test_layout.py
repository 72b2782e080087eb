"""The kernel tree's house rules, checked on the source (no GPU, no imports of the kernels):

- ``kernels/`` holds one folder per architecture (``portable/``, ``sm90/``) of modules: no
  deeper, no module outside them but the package's ``__init__``;
- no kernel module imports a private name (``_x``) of another, or reaches one through a
  module it imported; nor does any module of the package, nor name one as a build's
  ``"module:function"`` (the registry's and the compile matrix's kernel names);
- the kernel modules' imports form no circle and no chain longer than :data:`MAX_FLOORS`
  modules (a kernel, its building blocks, the shared pieces under them);
- nothing in ``src/fp8mla`` carries measurement instrumentation (``PROBE`` switches, cycle
  stamps) or a run diary: no round numbers, run ids or NOTES files, and no measured
  microsecond figure in a comment or docstring (measurements live in ``docs/design/``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
KERNELS = SRC / "fp8mla" / "kernels"
PREFIX = "fp8mla.kernels"
MAX_FLOORS = 4


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in KERNELS.rglob("*.py")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(
    path: Path, modules: dict[str, Path], prefix: str = PREFIX
) -> tuple[set[str], list[str]]:
    """The modules under ``prefix`` that ``path`` imports, and its uses of private names of
    them (``from m import _x``, ``m._x`` through an imported module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    deps: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    deps.add(a.name)
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in modules:  # a module imported from its package
                    deps.add(sub)
                    aliases[a.asname or a.name] = sub
                else:
                    deps.add(node.module)
                    if _private(a.name):
                        private.append(f"from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            private.append(f"{aliases[node.value.id]}.{node.attr}")
    return deps, private


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules)[0] - {m} for m, p in modules.items()}


def test_kernels_are_laid_out_by_architecture():
    for path in KERNELS.rglob("*.py"):
        rel = path.relative_to(KERNELS).parts
        assert len(rel) <= 2, f"{path}: kernels/ is one folder per architecture, no deeper"
        if len(rel) == 1:
            assert rel[0] == "__init__.py", f"{path}: a kernel module outside an architecture"
    folders = {p.name for p in KERNELS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {"portable", "sm90"}


def test_no_private_name_crosses_kernel_modules():
    modules = _modules()
    found = {m: _imports(p, modules)[1] for m, p in modules.items()}
    assert not {m: uses for m, uses in found.items() if uses}


def _build_names(path: Path) -> list[str]:
    """The ``"module:_x"`` build names in ``path``'s strings, f-strings included (a private
    function named for a launch or a compile elsewhere)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if re.search(r"^[\w.{}]+:_\w", text):
            found.append(text)
    return found


def test_no_private_name_crosses_package_modules():
    package = {_name(p): p for p in SRC.joinpath("fp8mla").rglob("*.py")}
    found = {m: _imports(p, package, "fp8mla")[1] + _build_names(p) for m, p in package.items()}
    assert not {m: uses for m, uses in found.items() if uses}


def test_kernel_imports_form_no_circle_and_no_long_chain():
    graph = _graph()
    depth: dict[str, int] = {}

    def floors(m: str, stack: tuple[str, ...]) -> int:
        assert m not in stack, f"import circle: {' -> '.join(stack + (m,))}"
        if m not in depth:
            depth[m] = 1 + max((floors(d, stack + (m,)) for d in graph[m]), default=0)
        return depth[m]

    deepest = max(graph, key=lambda m: floors(m, ()))
    assert floors(deepest, ()) <= MAX_FLOORS, f"{deepest}: {depth[deepest]} floors of imports"


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


DIARY = re.compile(r"\bround \d|\brounds \d+[-–]\d|\bNOTES\b|\br\d{2}[a-h]\b")
FIGURE = re.compile(r"\d\s*(µs|us)\b")


def test_no_instrumentation_or_run_diary_in_the_package():
    found = []
    for path in SRC.joinpath("fp8mla").rglob("*"):
        if path.suffix not in (".py", ".c", ".cpp", ".h"):
            continue
        text = path.read_text(encoding="utf-8")
        for i, line in enumerate(text.splitlines(), 1):
            if "PROBE" in line or "_stamp" in line or DIARY.search(line):
                found.append(f"{path.relative_to(SRC)}:{i}: {line.strip()}")
        if path.suffix == ".py":
            for line_no, chunk in _comments_and_docstrings(path):
                if FIGURE.search(chunk):
                    found.append(f"{path.relative_to(SRC)}:{line_no}: a µs figure in a comment")
    assert not found, "\n".join(found)

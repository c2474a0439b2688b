"""Function size limits: no function of the engine, the Slicer module and its library, or the
training tools runs over :data:`MAX_LINES` lines or takes over :data:`MAX_PARAMETERS` parameters
(``self`` and ``cls`` aside; ``*args`` and ``**kwargs`` count one each). Tests are not held to it.

A function is measured from its ``def`` to its last line, nested functions inside their parent
(and each on its own too). :data:`EXCEPTIONS` names the few allowed to stay longer, each with the
reason; an exception that no longer needs its place fails the test, so the list stays honest.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
MAX_PARAMETERS = 8
#: what the limits cover: the engine, the Slicer module file and its library, the training tools
AREAS = (
    ROOT / "CARDSegment" / "cardseg",
    ROOT / "CARDSegment" / "CARDSegmentLib",
    ROOT / "CARDSegment" / "CARDSegment.py",
    ROOT / "Training",
)
#: at most five; ``"path/from/root.py:function"``: why it may stay as it is
EXCEPTIONS: Dict[str, str] = {}
MAX_EXCEPTIONS = 5


class Function(NamedTuple):
    """One function: where it is (``path:line name``), its length in lines and its parameter count."""

    key: str
    where: str
    lines: int
    parameters: int


def parameter_count(node: ast.FunctionDef) -> int:
    """Positional, keyword-only, ``*args`` and ``**kwargs`` parameters, a leading ``self``/``cls`` aside."""
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def functions_of(path: Path, root: Path = ROOT) -> List[Function]:
    """Every function and method defined in ``path``, nested ones included (named from ``root``)."""
    rel = path.relative_to(root).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            out.append(Function(f"{rel}:{node.name}", f"{rel}:{node.lineno} {node.name}", lines, parameter_count(node)))
    return out


def all_functions() -> List[Function]:
    """The functions of every module in :data:`AREAS`."""
    files: List[Path] = []
    for area in AREAS:
        files += [area] if area.is_file() else sorted(area.rglob("*.py"))
    return [f for path in files for f in functions_of(path)]


def offenders(functions: List[Function]) -> List[Function]:
    """The functions over either limit."""
    return [f for f in functions if f.lines > MAX_LINES or f.parameters > MAX_PARAMETERS]


def test_the_scan_finds_what_it_measures(tmp_path):
    """The measure itself: a long function and a wide one are caught, ``self`` is not counted."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    params = ", ".join(f"p{i}" for i in range(MAX_PARAMETERS))
    src = (
        f"def long():\n{body}\n\n"
        f"def wide({params}, *rest):\n    pass\n\n"
        f"class C:\n    def method(self, {params}):\n        pass\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(src, encoding="utf-8")
    found = {f.key.split(":")[-1]: f for f in functions_of(path, tmp_path)}
    assert found["long"].lines == MAX_LINES + 1
    assert found["wide"].parameters == MAX_PARAMETERS + 1
    assert found["method"].parameters == MAX_PARAMETERS
    assert [f.key.split(":")[-1] for f in offenders(list(found.values()))] == ["long", "wide"]


def test_no_function_is_over_the_limits():
    """Every function keeps to the limits, but for the listed exceptions."""
    assert len(EXCEPTIONS) <= MAX_EXCEPTIONS, f"at most {MAX_EXCEPTIONS} exceptions"
    over = [f for f in offenders(all_functions()) if f.key not in EXCEPTIONS]
    assert not over, f"functions over {MAX_LINES} lines or {MAX_PARAMETERS} parameters:\n" + "\n".join(
        f"  {f.where}: {f.lines} lines, {f.parameters} parameters" for f in sorted(over)
    )


def test_every_exception_still_needs_its_place():
    """An exception that now keeps to the limits (or is gone) is taken off the list."""
    over = {f.key for f in offenders(all_functions())}
    stale = sorted(set(EXCEPTIONS) - over)
    assert not stale, "exceptions no longer over the limits (remove them): " + ", ".join(stale)

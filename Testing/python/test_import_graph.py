"""The project's import graph: no cycle, arrows in the engine only point down, no private name
taken from another module, no module above 450 lines.

Every ``import`` and ``from ... import`` statement of the engine (``CARDSegment/cardseg``), the
Slicer module (``CARDSegment/CARDSegment.py``, ``CARDSegment/CARDSegmentLib``) and the training
tools (``Training/cardseg_train``, ``Training/cardseg_gpu``) is read with :mod:`ast`, at module level and
inside functions alike (a lazy import still ties two modules together). Relative imports are
resolved; ``from package import name`` counts as an import of the submodule ``package.name``
when that is a module of the project, else of the package. Only imports between the project's own
modules make edges; parent packages that Python initialises on the way are not counted.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: where each area's modules live: (folder that holds the top-level package or module, its name)
AREAS: Dict[str, List[Tuple[Path, str]]] = {
    "engine": [(ROOT / "CARDSegment", "cardseg")],
    "slicer": [(ROOT / "CARDSegment", "CARDSegmentLib"), (ROOT / "CARDSegment", "CARDSegment")],
    "training": [(ROOT / "Training", "cardseg_train"), (ROOT / "Training", "cardseg_gpu")],
}

#: counted as ``ruff format`` lays the code out (its one argument a line in long calls adds about
#: a third to what the hand-wrapped code had at 450)
MAX_LINES = 650

#: the engine's layers, lowest first: a module may import its own layer and the layers listed
#: for it, nothing else (``cardseg/__init__.py`` holds only the version and belongs to ``base``)
ENGINE_LAYERS: Dict[str, Set[str]] = {
    "base": set(),  # errors, progress, file helpers, shared option checks
    "method": {"base"},  # the paper: diffusion, trajectory, calibrators, networks
    "metrics": {"base", "method"},  # segmentation and calibration metrics of the method's outputs
    "io": {"base"},  # formats, headers, DICOM, volume, slice grid, output folders
    "bundle": {"base", "method", "metrics", "io"},
    "review": {"base", "method", "metrics", "io", "bundle"},
    "segment": {"base", "method", "metrics", "io", "bundle", "review"},
    "cine": {"base", "metrics", "io"},  # a cine's phases, volume curves, rates and wall thickness
    "cohort": {"base", "method", "metrics", "io", "bundle", "review", "segment", "cine"},
    "cli": {"base", "method", "metrics", "io", "bundle", "review", "segment", "cine", "cohort"},
}
#: top-level packages the engine never imports (it finds the training commands by entry point)
ENGINE_NEVER_IMPORTS = ("cardseg_train", "cardseg_gpu", "CARDSegmentLib", "CARDSegment")


def engine_layer(module: str) -> Optional[str]:
    """The layer of an engine module (``None`` for a module outside the engine)."""
    parts = module.split(".")
    if parts[0] != "cardseg":
        return None
    if len(parts) == 1 or parts[1] == "base":
        return "base"
    if parts[1] in ("cli", "__main__", "serve", "plugins"):
        return "cli"
    if parts[1] == "report":  # report.json of a segmentation run: beside cardseg.segment
        return "segment"
    if parts[1] in ENGINE_LAYERS:
        return parts[1]
    return "unknown"


# --------------------------------------------------------------------------------------------
# reading the imports
# --------------------------------------------------------------------------------------------
@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    area: str
    lines: int = 0


@dataclass
class Import:
    source: str
    target: str  # the module imported (a project module)
    lineno: int
    names: List[str] = field(default_factory=list)  # names taken with ``from target import ...``


def find_modules() -> Dict[str, Module]:
    modules: Dict[str, Module] = {}
    for area, places in AREAS.items():
        for base, top in places:
            single = base / f"{top}.py"
            paths = [single] if single.is_file() else sorted((base / top).rglob("*.py"))
            for path in paths:
                rel = path.relative_to(base).with_suffix("")
                parts = list(rel.parts)
                is_package = parts[-1] == "__init__"
                if is_package:
                    parts = parts[:-1]
                if any(p.startswith(".") or p == "__pycache__" for p in parts):
                    continue
                name = ".".join(parts)
                modules[name] = Module(name, path, is_package, area, len(path.read_text(encoding="utf-8").splitlines()))
    return modules


def _resolve_relative(module: Module, level: int, target: Optional[str]) -> str:
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join(package + ([target] if target else []))


def _project_module(name: str, modules: Dict[str, Module]) -> Optional[str]:
    """``name`` or its longest prefix that is a project module (``import a.b.c`` of an attribute)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        candidate = ".".join(parts[:cut])
        if candidate in modules:
            return candidate
    return None


def read_imports(modules: Dict[str, Module]) -> List[Import]:
    found: List[Import] = []
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(encoding="utf-8"), filename=str(mod.path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _project_module(alias.name, modules)
                    if target is not None:
                        found.append(Import(mod.name, target, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(mod, node.level, node.module) if node.level else (node.module or "")
                package = _project_module(base, modules)
                if package is None:
                    continue
                whole: List[str] = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if base == package and sub in modules:
                        found.append(Import(mod.name, sub, node.lineno))
                    else:
                        whole.append(alias.name)
                if whole:
                    found.append(Import(mod.name, package, node.lineno, whole))
    return found


def import_graph(imports: Iterable[Import]) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for imp in imports:
        if imp.source != imp.target:
            graph.setdefault(imp.source, set()).add(imp.target)
    return graph


# --------------------------------------------------------------------------------------------
# cycles
# --------------------------------------------------------------------------------------------
def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component with more than one module
    (Tarjan's algorithm, iterative), sorted for a stable message."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []
    counter = [0]
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})

    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(_one_cycle(graph, set(c)) for c in components)


def _one_cycle(graph: Dict[str, Set[str]], component: Set[str]) -> List[str]:
    """A shortest cycle through the component's first module (breadth-first, inside the component)."""
    start = min(component)
    parent: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in component:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a component always has one


# --------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def project():
    modules = find_modules()
    return modules, read_imports(modules)


def test_the_walk_finds_every_area(project):
    modules, imports = project
    for area in AREAS:
        assert any(m.area == area for m in modules.values()), f"no module found for {area}"
    assert "cardseg.segment" in modules and "cardseg.cli" in modules
    assert any(i.source == "cardseg.cli" for i in imports), "the imports of cardseg.cli were not read"


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    long = {str(i): {str(i + 1)} for i in range(3000)}  # deep chains need no recursion
    long["3000"] = {"0"}
    assert len(find_cycles(long)[0]) == 3002


def test_the_graph_reads_lazy_relative_and_submodule_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nfrom pkg import _hidden\n")
    monkeypatch.setitem(AREAS, "engine", [(tmp_path, "pkg")])
    monkeypatch.setitem(AREAS, "slicer", [])
    monkeypatch.setitem(AREAS, "training", [])
    modules = find_modules()
    imports = read_imports(modules)
    assert find_cycles(import_graph(imports)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    assert [(i.source, i.target, i.names) for i in imports if i.names == ["_hidden"]] == [
        ("pkg.sub.b", "pkg", ["_hidden"])
    ]


@pytest.mark.parametrize("area", list(AREAS))
def test_no_import_cycle(project, area):
    modules, imports = project
    cycles = [c for c in find_cycles(import_graph(imports)) if any(modules[m].area == area for m in c)]
    assert not cycles, f"import cycles in the {area}:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


def test_engine_arrows_point_down(project):
    modules, imports = project
    wrong = []
    for imp in imports:
        layer = engine_layer(imp.source)
        if layer is None:
            continue
        if imp.target.split(".")[0] in ENGINE_NEVER_IMPORTS:
            wrong.append(f"{imp.source}:{imp.lineno} imports {imp.target} (the engine never imports it)")
            continue
        target = engine_layer(imp.target)
        if layer == "unknown" or target == "unknown":
            wrong.append(
                f"{imp.source}:{imp.lineno} -> {imp.target}: a module outside the declared layers "
                "(add its package to ENGINE_LAYERS)"
            )
        elif target != layer and target not in ENGINE_LAYERS[layer]:
            wrong.append(
                f"{imp.source}:{imp.lineno} ({layer}) imports {imp.target} ({target}), a layer above "
                f"or beside it; {layer} may import {', '.join(sorted(ENGINE_LAYERS[layer])) or 'nothing'}"
            )
    assert not wrong, "engine imports against the layers:\n" + "\n".join("  " + w for w in sorted(wrong))


@pytest.mark.parametrize("area", list(AREAS))
def test_no_private_name_from_another_module(project, area):
    modules, imports = project
    wrong = []
    for imp in imports:
        if modules[imp.source].area != area:
            continue
        private = [n for n in imp.names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]
        if imp.target.rsplit(".", 1)[-1].startswith("_") and not imp.target.endswith("__"):
            private.append(f"module {imp.target}")
        if private:
            wrong.append(f"{imp.source}:{imp.lineno} takes {', '.join(private)} from {imp.target}")
    assert not wrong, (
        f"private names imported across modules in the {area} (make them public where they "
        "are shared, or move them):\n" + "\n".join("  " + w for w in sorted(wrong))
    )


@pytest.mark.parametrize("area", list(AREAS))
def test_no_module_above_the_size_limit(project, area):
    modules, _ = project
    long = sorted((m.lines, m.name) for m in modules.values() if m.area == area and m.lines > MAX_LINES)
    assert not long, f"modules above {MAX_LINES} lines in the {area}:\n" + "\n".join(
        f"  {name}: {lines}" for lines, name in long[::-1]
    )

"""The Slicer module's files, checked without Slicer: they compile, CMake lists all of them, the
.ui matches the parameter node, the library keeps out of Qt, the package list matches pyproject."""

from __future__ import annotations

import ast
import py_compile
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
MODULE_FILE = MODULE_DIR / "CARDSegment.py"
LIB_DIR = MODULE_DIR / "CARDSegmentLib"
UI_FILE = MODULE_DIR / "Resources" / "UI" / "CARDSegment.ui"
LISTED_SUFFIXES = {".py", ".ui", ".png"}


def module_sources():
    return [MODULE_FILE] + sorted(LIB_DIR.glob("*.py"))


@pytest.mark.parametrize("path", module_sources(), ids=lambda p: p.name)
def test_module_sources_compile(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)


# ---------------------------------------------------------------------------------------------
# CMake


def _cmake_calls(text: str, command: str):
    """The argument lists of every ``command(...)`` call (comments stripped, no nesting needed)."""
    text = re.sub(r"#[^\n]*", "", text)
    return [m.group(1).split() for m in re.finditer(rf"\b{command}\s*\(([^)]*)\)", text, flags=re.I)]


def _expand(items, variables):
    out = []
    for item in items:
        m = re.fullmatch(r"\$\{(\w+)\}", item)
        if m and m.group(1) in variables and isinstance(variables[m.group(1)], list):
            out += variables[m.group(1)]
            continue
        out.append(re.sub(r"\$\{(\w+)\}", lambda mm: str(variables.get(mm.group(1), mm.group(0))), item))
    return out


def _glob_recurse(base: Path, pattern: str):
    """CMake's GLOB_RECURSE for a pattern "dir/sub/*.ext": every *.ext below dir/sub."""
    folder, _, name = pattern.rpartition("/")
    root = base / folder
    return sorted(p.relative_to(base).as_posix() for p in root.rglob(name) if p.is_file()) if root.is_dir() else []


def cmake_module_files():
    """What CARDSegment/CMakeLists.txt hands to slicerMacroBuildScriptedModule (globs evaluated).

    A tiny interpreter for the few commands the file uses, run in file order.
    """
    text = (MODULE_DIR / "CMakeLists.txt").read_text(encoding="utf-8")
    variables = {}
    body = re.sub(r"#[^\n]*", "", text)
    for m in re.finditer(r"\b(set|file|list)\s*\(([^)]*)\)", body, flags=re.I):
        command, args = m.group(1).lower(), m.group(2).split()
        if command == "set":
            variables[args[0]] = args[1] if len(args) == 2 else _expand(args[1:], variables)
        elif command == "file":
            assert args[0] == "GLOB_RECURSE", args
            var, rest = args[1], [a for a in args[2:] if a != "CONFIGURE_DEPENDS"]
            if rest[0] == "RELATIVE":
                assert rest[1] == "${CMAKE_CURRENT_SOURCE_DIR}"
                rest = rest[2:]
            variables[var] = [f for pattern in rest for f in _glob_recurse(MODULE_DIR, pattern)]
            variables[var + "__patterns"] = rest
        elif args[0] == "APPEND":
            variables[args[1]] = list(variables.get(args[1], [])) + _expand(args[2:], variables)
    (build,) = _cmake_calls(text, "slicerMacroBuildScriptedModule")
    keys = {"NAME", "SCRIPTS", "RESOURCES", "WITH_GENERIC_TESTS"}
    sections, current = {}, None
    for a in build:
        if a in keys:
            current = a
            sections[a] = []
        else:
            sections[current].append(a)
    assert _expand(sections["NAME"], variables) == ["CARDSegment"]
    assert "WITH_GENERIC_TESTS" in sections
    scripts = _expand(sections["SCRIPTS"], variables)
    resources = _expand(sections["RESOURCES"], variables)
    return scripts, resources, variables


def test_cmakelists_lists_every_script_and_resource_of_the_module_folder():
    scripts, resources, variables = cmake_module_files()
    listed = set(scripts) | set(resources)
    assert len(scripts) == len(set(scripts)) and len(resources) == len(set(resources))
    for name in listed:
        assert (MODULE_DIR / name).is_file(), f"CMakeLists.txt lists {name}, which does not exist"
    assert all(s.endswith(".py") for s in scripts)
    present = {p.relative_to(MODULE_DIR).as_posix() for p in MODULE_DIR.rglob("*")
               if p.is_file() and p.suffix in LISTED_SUFFIXES and "__pycache__" not in p.parts
               and p.parts[len(MODULE_DIR.parts)] != "Testing"}
    assert present - listed == set(), "files the built extension would miss"
    # the engine and the shipped bundles come in through globs, so new files need no edit
    assert "cardseg/*.py" in variables["CARDSEG_PYTHON_SCRIPTS__patterns"]
    assert "cardseg/cli.py" in scripts and "cardseg/calibration/card.py" in scripts
    assert "CARDSegmentLib/process.py" in scripts
    assert {"Resources/UI/CARDSegment.ui", "Resources/Icons/CARDSegment.png"} <= set(resources)


def test_every_shipped_bundle_file_is_a_resource(tmp_path):
    _, resources, variables = cmake_module_files()
    patterns = variables["CARDSEG_BUNDLE_FILES__patterns"]
    bundle_files = {p.relative_to(MODULE_DIR).as_posix() for p in (MODULE_DIR / "cardseg" / "bundles").rglob("*")
                    if p.is_file() and not p.name.startswith(".")}
    assert bundle_files <= set(resources)
    # the globs cover what pip ships as package data, and would pick up a default bundle
    suffixes = {p.rpartition("*")[2] for p in patterns}
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    for ext in re.findall(r'"bundles/\*/\*(\.[a-z]+)"', pyproject):
        assert ext in suffixes
    fake = tmp_path / "cardseg" / "bundles" / "acdc"
    fake.mkdir(parents=True)
    for name in ("bundle.json", "primary.safetensors", "reference.safetensors", "README.md"):
        (fake / name).write_text("x")
    found = {f for pattern in patterns for f in _glob_recurse(tmp_path, pattern)}
    assert found == {f"cardseg/bundles/acdc/{n}" for n in
                     ("bundle.json", "primary.safetensors", "reference.safetensors", "README.md")}


def test_testing_folder_follows_slicer_convention():
    assert "add_subdirectory(Python)" in (MODULE_DIR / "Testing" / "CMakeLists.txt").read_text(encoding="utf-8")
    assert (MODULE_DIR / "Testing" / "Python" / "CMakeLists.txt").is_file()
    module_cmake = (MODULE_DIR / "CMakeLists.txt").read_text(encoding="utf-8")
    assert "slicer_add_python_unittest(SCRIPT ${MODULE_NAME}.py)" in module_cmake
    assert "add_subdirectory(Testing)" in module_cmake
    py_in_testing = [p for p in (MODULE_DIR / "Testing").rglob("*.py")]
    registered = (MODULE_DIR / "Testing" / "Python" / "CMakeLists.txt").read_text(encoding="utf-8")
    for p in py_in_testing:
        assert p.name in registered, f"{p} is not registered in Testing/Python/CMakeLists.txt"


def test_extension_adds_the_module():
    text = re.sub(r"#[^\n]*", "", (REPO / "CMakeLists.txt").read_text(encoding="utf-8"))
    assert re.search(r"add_subdirectory\(\s*CARDSegment\s*\)", text)
    assert 'EXTENSION_DEPENDS "PyTorch"' in text and 'EXTENSION_CATEGORY "Segmentation"' in text


def test_icon_is_the_extension_icon():
    icon = MODULE_DIR / "Resources" / "Icons" / "CARDSegment.png"
    assert icon.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert icon.read_bytes() == (REPO / "Resources" / "Icons" / "CARDSegment.png").read_bytes()


# ---------------------------------------------------------------------------------------------
# the .ui and the module file


def _module_tree():
    return ast.parse(MODULE_FILE.read_text(encoding="utf-8"))


def parameter_fields():
    for node in _module_tree().body:
        if isinstance(node, ast.ClassDef) and any(
                getattr(d, "id", None) == "parameterNodeWrapper" for d in node.decorator_list):
            return {stmt.target.id for stmt in node.body if isinstance(stmt, ast.AnnAssign)}
    raise AssertionError("no @parameterNodeWrapper class in CARDSegment.py")


def ui_widgets():
    root = ET.parse(UI_FILE).getroot()
    widgets, bound = {}, {}
    for w in root.iter("widget"):
        widgets[w.get("name")] = w.get("class")
        for prop in w.findall("property"):
            if prop.get("name") == "SlicerParameterName":
                bound[prop.find("string").text] = w.get("name")
    return root, widgets, bound


def test_ui_binds_exactly_the_parameter_node_fields():
    root, widgets, bound = ui_widgets()
    assert root.find("class").text == "CARDSegment"
    assert widgets["CARDSegment"] == "qMRMLWidget"
    assert set(bound) == parameter_fields()
    # each bound widget is of a kind Slicer's parameterNodeWrapper connects to that field's type
    kinds = {"inputVolume": "qMRMLNodeComboBox", "bundleSource": "QComboBox", "bundleFolder": "ctkPathLineEdit",
             "device": "QComboBox", "method": "QComboBox", "loadProbabilities": "QCheckBox",
             "overlay": "QComboBox", "overlayOpacity": "ctkSliderWidget"}
    assert {field: widgets[name] for field, name in bound.items()} == kinds
    custom = {c.find("class").text for c in root.iter("customwidget")}
    assert {cls for cls in widgets.values() if not cls.startswith("Q")} <= custom


def test_module_uses_only_widgets_that_the_ui_has():
    _, widgets, _ = ui_widgets()
    used = set(re.findall(r"self\.ui\.(\w+)", MODULE_FILE.read_text(encoding="utf-8")))
    assert used and used <= set(widgets), used - set(widgets)


def test_module_has_the_four_slicer_classes_and_no_method_code():
    tree = _module_tree()
    classes = {n.name: [getattr(b, "id", None) for b in n.bases] for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "ScriptedLoadableModule" in classes["CARDSegment"]
    assert "ScriptedLoadableModuleWidget" in classes["CARDSegmentWidget"]
    assert "ScriptedLoadableModuleLogic" in classes["CARDSegmentLogic"]
    assert "ScriptedLoadableModuleTest" in classes["CARDSegmentTest"]
    imported = _imports(MODULE_FILE)
    assert not any(m.split(".")[0] in ("cardseg", "torch", "numpy") for m in imported), imported


def _imports(path: Path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(LIB_DIR.glob("*.py")), ids=lambda p: p.name)
def test_library_is_mrml_only(path):
    imported = _imports(path)
    assert not {m.split(".")[0] for m in imported} & {"qt", "ctk", "cardseg", "torch", "PythonQt"}
    assert not any("ScriptedLoadableModule" in m for m in imported)
    names = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))}
    assert not {n for n in names if n and ("ScriptedLoadableModule" in n or n in ("mrmlScene", "app"))}


def test_package_list_matches_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    from CARDSegmentLib.dependencies import REQUIREMENTS, is_new_enough, missing_requirements

    declared = {}
    for dep in tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9.]+))?", dep.strip())
        assert m, dep
        declared[m.group(1).lower()] = m.group(2)
    assert {r.distribution.lower(): r.minimum for r in REQUIREMENTS} == declared
    assert REQUIREMENTS[0].module == "torch"  # torch comes first (PyTorch extension)
    # this environment runs the engine, so nothing is missing here
    assert missing_requirements() == []
    assert [r.module for r in missing_requirements(find_spec=lambda name: None)] == [r.module for r in REQUIREMENTS]
    old = missing_requirements(version_of=lambda dist: "0.1")
    assert {r.module for r in old} == {r.module for r in REQUIREMENTS if r.minimum}
    assert is_new_enough("2.13.0+cpu", "2.1") and not is_new_enough("1.13.1", "2.1")
    assert is_new_enough("1.4", "1.4.0") and not is_new_enough(None, "1.0") and is_new_enough(None, None)

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
    return [MODULE_FILE] + sorted(LIB_DIR.rglob("*.py"))


@pytest.mark.parametrize("path", module_sources(), ids=lambda p: p.relative_to(MODULE_DIR).as_posix())
def test_module_sources_compile(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)
    # Slicer 5.8 runs Python 3.9: no syntax from later versions (match, except*, ...)
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 9))


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
    present = {
        p.relative_to(MODULE_DIR).as_posix()
        for p in MODULE_DIR.rglob("*")
        if p.is_file()
        and p.suffix in LISTED_SUFFIXES
        and "__pycache__" not in p.parts
        and p.parts[len(MODULE_DIR.parts)] != "Testing"
    }
    assert present - listed == set(), "files the built extension would miss"
    # the engine and the shipped bundles come in through globs, so new files need no edit
    assert "cardseg/*.py" in variables["CARDSEG_PYTHON_SCRIPTS__patterns"]
    assert "cardseg/cli.py" in scripts and "cardseg/method/calibration/card.py" in scripts
    assert "CARDSegmentLib/runs/process.py" in scripts
    assert {"Resources/UI/CARDSegment.ui", "Resources/Icons/CARDSegment.png"} <= set(resources)


def test_every_shipped_bundle_file_is_a_resource(tmp_path):
    _, resources, variables = cmake_module_files()
    patterns = variables["CARDSEG_BUNDLE_FILES__patterns"]
    bundle_files = {
        p.relative_to(MODULE_DIR).as_posix()
        for p in (MODULE_DIR / "cardseg" / "bundles").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
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
    assert found == {
        f"cardseg/bundles/acdc/{n}"
        for n in ("bundle.json", "primary.safetensors", "reference.safetensors", "README.md")
    }


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
    assert 'EXTENSION_DEPENDS "PyTorch"' in text and 'EXTENSION_CATEGORY "Cardiac"' in text


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
            getattr(d, "id", None) == "parameterNodeWrapper" for d in node.decorator_list
        ):
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


#: fields the module binds by hand instead of through SlicerParameterName: field -> (widget, signal)
HAND_BOUND = {"bundleFolder": ("bundleFolderPathLineEdit", "currentPathChanged(QString)")}


def test_ui_binds_exactly_the_parameter_node_fields():
    root, widgets, bound = ui_widgets()
    assert root.find("class").text == "CARDSegment"
    assert widgets["CARDSegment"] == "qMRMLWidget"
    assert set(bound) | set(HAND_BOUND) == parameter_fields() and not set(bound) & set(HAND_BOUND)
    # each bound widget is of a kind Slicer's parameterNodeWrapper connects to that field's type
    kinds = {
        "inputVolume": "qMRMLNodeComboBox",
        "bundleSource": "QComboBox",
        "device": "QComboBox",
        "method": "QComboBox",
        "fastReview": "QCheckBox",
        "loadProbabilities": "QCheckBox",
        "overlay": "QComboBox",
        "overlayOpacity": "ctkSliderWidget",
        "frameMode": "QComboBox",
        "edFrame": "QSpinBox",
        "esFrame": "QSpinBox",
    }
    assert {field: widgets[name] for field, name in bound.items()} == kinds
    custom = {c.find("class").text for c in root.iter("customwidget")}
    assert {cls for cls in widgets.values() if not cls.startswith("Q")} <= custom


def test_bundle_folder_is_bound_by_hand_and_keeps_a_history():
    """A pathlib.Path field would show an unset folder as "." (Slicer's path connector writes
    str(Path())); the module binds a plain string itself and records used folders."""
    root, widgets, _ = ui_widgets()
    source = MODULE_FILE.read_text(encoding="utf-8")
    for field, (widget, signal) in HAND_BOUND.items():
        assert widgets[widget] == "ctkPathLineEdit"
        assert f'self.ui.{widget}.connect("{signal}"' in source
    fields = {
        stmt.target.id: stmt
        for node in _module_tree().body
        if isinstance(node, ast.ClassDef)
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and node.name == "CARDSegmentParameterNode"
    }
    assert ast.unparse(fields["bundleFolder"].annotation) == "str"
    assert ast.literal_eval(fields["bundleFolder"].value) == ""
    box = next(w for w in root.iter("widget") if w.get("name") == "bundleFolderPathLineEdit")
    keys = [p.find("string").text for p in box.findall("property") if p.get("name") == "settingKey"]
    assert keys == ["CARDSegment/BundleFolder"]  # the history lives in Slicer's settings under this key
    assert "bundleFolderPathLineEdit.addCurrentPathToHistory()" in source


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
    # the Logic is Slicer's wrapper of CARDSegmentLib's: what it does lives in the library
    logic = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CARDSegmentLogic")
    assert "ModuleLogic" in classes["CARDSegmentLogic"]
    assert {f.name for f in logic.body if isinstance(f, ast.FunctionDef)} == {"__init__", "getParameterNode"}


def test_the_engine_rules_the_library_shares_import_only_numpy():
    """At module level (a function the panel does not call may import more when it runs)."""
    import sys

    for module in SHARED_ENGINE_MODULES:
        tree = ast.parse(MODULE_DIR.joinpath(*module.split(".")).with_suffix(".py").read_text(encoding="utf-8"))
        top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
        outside = {m.split(".")[0] for m in top} - set(sys.stdlib_module_names) - {"numpy"}
        assert not outside, (module, outside)


def _imports(path: Path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


#: engine modules the library may import: pure rules it shares with the engine, which import
#: nothing but the standard library and numpy (checked below), so Slicer's own Python runs them
SHARED_ENGINE_MODULES = {"cardseg.cine.phases"}


@pytest.mark.parametrize("path", sorted(LIB_DIR.rglob("*.py")), ids=lambda p: p.relative_to(MODULE_DIR).as_posix())
def test_library_is_mrml_only(path):
    imported = _imports(path) - SHARED_ENGINE_MODULES
    assert not {m.split(".")[0] for m in imported} & {"qt", "ctk", "cardseg", "torch", "PythonQt"}
    assert not any("ScriptedLoadableModule" in m for m in imported)
    names = {
        getattr(n, "id", None) or getattr(n, "attr", None)
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert not {n for n in names if n and ("ScriptedLoadableModule" in n or n in ("mrmlScene", "app"))}


def _declared_dependencies():
    """pyproject.toml's ``dependencies`` as {name: minimum or None}."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = {}
    for dep in tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9.]+))?", dep.strip())
        assert m, dep
        declared[m.group(1).lower()] = m.group(2)
    return declared


def _dependencies_module():
    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    from CARDSegmentLib.install import dependencies

    return dependencies


def test_package_list_matches_pyproject():
    from_module = _dependencies_module()
    REQUIREMENTS, is_new_enough, missing_requirements = (
        from_module.REQUIREMENTS,
        from_module.is_new_enough,
        from_module.missing_requirements,
    )
    declared = _declared_dependencies()
    assert {r.distribution.lower(): r.minimum for r in REQUIREMENTS} == declared
    assert "einops" in declared  # MONAI's SwinUNETR imports it at run time; MONAI lists it as an extra only
    assert REQUIREMENTS[0].module == "torch"  # torch comes first (PyTorch extension)
    # this environment runs the engine, so nothing is missing here
    assert missing_requirements() == []
    assert [r.module for r in missing_requirements(find_spec=lambda name: None)] == [r.module for r in REQUIREMENTS]
    old = missing_requirements(version_of=lambda dist: "0.1")
    assert {r.module for r in old} == {r.module for r in REQUIREMENTS if r.minimum}
    assert is_new_enough("2.13.0+cpu", "2.1") and not is_new_enough("1.13.1", "2.1")
    assert is_new_enough("1.4", "1.4.0") and not is_new_enough(None, "1.0") and is_new_enough(None, None)


# ---------------------------------------------------------------------------------------------
# the torch and MONAI minimums, against what MONAI itself declares

#: ``Requires-Dist: torch`` of each MONAI release from 1.5 on, read from the wheels' METADATA
#: (1.5.0 also caps torch below 2.7); checked below against the installed MONAI's own metadata
MONAI_TORCH_MINIMUM = {"1.5.0": "2.4.1", "1.5.1": "2.4.1", "1.5.2": "2.4.1", "1.6.0": "2.8.0", "1.6.1": "2.8.0"}
#: the first MONAI release whose SwinUNETR takes no ``img_size`` (1.4.0 requires it)
MONAI_SWINUNETR_WITHOUT_IMG_SIZE = "1.5.0"


def _declared_torch_minimum(requires):
    """The torch minimum in a list of ``Requires-Dist`` strings (None when torch has none)."""
    for req in requires or []:
        m = re.match(r"torch\s*(?:\(\s*)?([^;]*)", req)
        if m and re.match(r"torch\b(?![-_.a-z])", req):
            lower = re.search(r">=\s*([0-9][0-9.]*)", m.group(1))
            return lower.group(1) if lower else None
    return None


def test_torch_and_monai_minimums_follow_monai_metadata():
    importlib_metadata = pytest.importorskip("importlib.metadata")
    dependencies = _dependencies_module()
    torch_min = dependencies.requirement("torch").minimum
    monai_min = dependencies.requirement("monai").minimum
    ge = dependencies.is_new_enough  # ge(a, b): version a >= version b (padded: "1.5" == "1.5.0")
    # MONAI old enough to lack an img_size-free SwinUNETR is refused
    assert ge(monai_min, MONAI_SWINUNETR_WITHOUT_IMG_SIZE)
    # torch minimum = what the oldest accepted MONAI asks for: lower lets pip swap torch, higher is needless
    accepted = [v for v in MONAI_TORCH_MINIMUM if ge(v, monai_min)]
    oldest = min(accepted, key=dependencies.version_tuple)
    assert ge(torch_min, MONAI_TORCH_MINIMUM[oldest]) and ge(MONAI_TORCH_MINIMUM[oldest], torch_min)
    assert all(ge(MONAI_TORCH_MINIMUM[v], torch_min) for v in accepted)
    # the table matches the installed MONAI's own metadata, and the installed torch satisfies it
    installed = importlib_metadata.version("monai")
    declared = _declared_torch_minimum(importlib_metadata.requires("monai"))
    assert declared is not None, importlib_metadata.requires("monai")
    if installed in MONAI_TORCH_MINIMUM:
        assert MONAI_TORCH_MINIMUM[installed] == declared
    assert ge(declared, torch_min)  # the installed MONAI, too, needs at least our torch minimum
    assert ge(importlib_metadata.version("torch"), declared)
    assert ge(installed, monai_min)
    # the module hands the same minimum to the PyTorch extension's installer
    assert dependencies.torch_version_requirement() == f">={torch_min}"


def test_installed_monai_swinunetr_needs_no_img_size():
    inspect = pytest.importorskip("inspect")
    nets = pytest.importorskip("monai.networks.nets")
    params = inspect.signature(nets.SwinUNETR.__init__).parameters
    assert "img_size" not in params or params["img_size"].default is not inspect.Parameter.empty
    pytest.importorskip("einops")


def test_declared_torch_minimum_parsing():
    assert _declared_torch_minimum(["numpy<3.0,>=1.24", "torch<2.7.0,>=2.4.1"]) == "2.4.1"
    assert _declared_torch_minimum(["torch>=2.8.0", "numpy"]) == "2.8.0"
    assert _declared_torch_minimum(["torchvision>=0.1; extra == 'all'", "torch>=1.9"]) == "1.9"
    assert _declared_torch_minimum(["numpy"]) is None


def test_old_torch_and_pip_pins():
    dependencies = _dependencies_module()
    versions = {"torch": "2.1.2+cu121"}
    assert "2.1.2+cu121" in dependencies.torch_too_old(versions.get) and "PyTorch Utils" in dependencies.torch_too_old(
        versions.get
    )
    assert dependencies.torch_too_old({"torch": "2.4.1"}.get) is None
    assert dependencies.torch_too_old({}.get) is None  # not installed: the PyTorch extension installs it
    missing = [dependencies.requirement(m) for m in ("torch", "monai", "einops")]
    # torch itself never goes to pip; an installed torch is pinned so pip keeps the extension's build
    assert dependencies.pip_specs(missing, {"torch": "2.5.1+cu124"}.get) == [
        "monai>=1.5",
        "einops",
        "torch==2.5.1+cu124",
    ]
    assert dependencies.pip_specs(missing, {}.get) == ["monai>=1.5", "einops"]
    assert dependencies.pip_specs(missing[:1], {"torch": "2.5.1"}.get) == []


#: the library's packages, top first: a package imports only packages below it
LIBRARY_LAYERS = [{"panel"}, {"cine"}, {"runs"}, {"outputs", "install"}]


def _library_imports(path: Path):
    """The library packages ``path`` imports (relative imports resolved from its own package)."""
    package = path.parent.name
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        target = (node.module or "").split(".")[0]
        if node.level == 1:
            found.add(package)
        elif target:
            found.add(target)
    return found


def test_library_packages_point_down():
    rank = {name: depth for depth, layer in enumerate(LIBRARY_LAYERS) for name in layer}
    assert {p.name for p in LIB_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(rank)
    assert sorted(p.name for p in LIB_DIR.glob("*.py")) == ["__init__.py"]
    for path in LIB_DIR.glob("*/*.py"):
        own = path.parent.name
        for used in _library_imports(path) - {own}:
            assert rank[used] > rank[own], f"{path.relative_to(LIB_DIR)} imports {used}"

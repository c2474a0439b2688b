"""What the README's test command needs on a user's fresh clone: no ../shared data beside it (every
test that reads ACDC skips without it), skipped tests named with their reason, and the demo's
outputs git-ignored."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA_NAMES = {"ACDC", "HAS_ACDC"}


def _skips_without_data(fn: ast.FunctionDef, source: str, module_marks: str) -> bool:
    decorators = " ".join(ast.get_source_segment(source, d) or "" for d in fn.decorator_list)
    body = ast.get_source_segment(source, fn) or ""
    return (
        "needs_acdc" in decorators
        or any(n in decorators for n in DATA_NAMES)
        and "skip" in decorators
        or re.search(r"if not \(?(HAS_)?ACDC.*\n\s+pytest\.skip\(", body) is not None
        or "needs_acdc" in module_marks
    )


def _uses_data(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Name) and n.id in DATA_NAMES for n in ast.walk(fn))


@pytest.mark.parametrize("path", sorted(HERE.glob("test_*.py")), ids=lambda p: p.name)
def test_every_test_reading_acdc_skips_without_it(path):
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    marks = "".join(
        ast.get_source_segment(source, n) or ""
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
    )
    bad = [
        fn.name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        and fn.name.startswith("test_")
        and _uses_data(fn)
        and not _skips_without_data(fn, source, marks)
    ]
    assert not bad, f"{path.name}: {bad} read ../shared/data/acdc without skipping where it is absent (use needs_acdc)"


def test_run_tests_script_reports_skips_and_the_browser():
    script = (REPO / "Testing" / "run-tests.sh").read_text(encoding="utf-8")
    pytest_line = next(ln for ln in script.splitlines() if "-m pytest" in ln)
    assert "-rs" in pytest_line.split(), pytest_line
    assert "install-browser.sh" in script


@pytest.mark.parametrize("path", ["demo.nii.gz", "demo-out/report.json", "demo-out/segmentation.nii.gz"])
def test_the_readme_demo_outputs_are_ignored(path):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"synth {path.split('/')[0]}" in readme or f"-o {path.split('/')[0]}" in readme
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO)
    assert r.returncode == 0, f"{path} is not git-ignored"

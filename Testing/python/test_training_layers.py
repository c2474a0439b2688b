"""The training tools' house: every module of ``cardseg_train`` sits in a subpackage, the
subpackages form layers whose imports only point down, the GPU run (``cardseg_gpu``) sits on top
of the library (never of the studies), and the built wheel leaves the studies and the GPU run out.

The imports are read by :mod:`test_import_graph`'s walk (lazy and relative imports included).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from test_import_graph import ROOT, find_modules, read_imports

#: the subpackages of ``cardseg_train``, lowest first: each may import itself and those before it
TRAINING_LAYERS: List[str] = [
    "base",  # cache keys, --out records, report files, plots, statistics, shared CLI options
    "data",  # ACDC slices and volumes, augmentation, corruptions, perturbations
    "evaluation",  # segmentation quality of a bundle on labelled volumes
    "training",  # one denoiser: config, objective, steps, loop, run folders, export
    "calibration",  # fit-calibration and the calibration harness of evaluate
    "review",  # the flagged-region rule and p_error
    "indices",  # the cardiac-index intervals
    "comparison",  # Table I and Table II
    "commands",  # the cardseg subcommands (entry points)
    "studies",  # one-off validation studies, not shipped
]
#: the top of the training area: it may import every layer of the library but the studies
GPU_PACKAGE = "cardseg_gpu"


def training_layer(module: str) -> Optional[int]:
    """The height of a ``cardseg_train`` module (``None`` outside it; ``-1`` for the package's own
    ``__init__``; ``len(TRAINING_LAYERS)`` for the GPU run)."""
    parts = module.split(".")
    if parts[0] == GPU_PACKAGE:
        return len(TRAINING_LAYERS)
    if parts[0] != "cardseg_train":
        return None
    if len(parts) == 1:
        return -1
    return TRAINING_LAYERS.index(parts[1]) if parts[1] in TRAINING_LAYERS else None


@pytest.fixture(scope="module")
def training():
    modules = find_modules()
    return modules, read_imports(modules)


def test_every_training_module_sits_in_a_declared_subpackage(training):
    modules, _ = training
    names = [m for m in modules if m.startswith("cardseg_train.")]
    assert len(names) > 40, "the walk found too few training modules"
    loose = [m for m in names if m.count(".") == 1 and not modules[m].is_package]
    assert not loose, f"modules of cardseg_train outside a subpackage: {loose}"
    unknown = sorted({m.split(".")[1] for m in names} - set(TRAINING_LAYERS))
    assert not unknown, f"subpackages of cardseg_train with no declared layer: {unknown}"


def test_training_arrows_point_down(training):
    _, imports = training
    wrong = []
    for imp in imports:
        source, target = training_layer(imp.source), training_layer(imp.target)
        if source is None or target is None:
            continue
        if target == -1:  # the package's __init__ holds a docstring only
            continue
        studies = TRAINING_LAYERS.index("studies")
        if target > source or (source == len(TRAINING_LAYERS) and target == studies):
            wrong.append(f"{imp.source}:{imp.lineno} imports {imp.target}")
    assert not wrong, "imports pointing up in the training tools:\n" + "\n".join("  " + w for w in sorted(wrong))


def test_the_layer_rule_catches_an_upward_import():
    assert training_layer("cardseg_train.base.stats") < training_layer("cardseg_train.commands.fit")
    assert training_layer("cardseg_gpu.run") > training_layer("cardseg_train.studies.flip")
    assert training_layer("cardseg.segment") is None


def _built_wheel(tmp: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(ROOT)],
        check=True,
        cwd=tmp,
    )
    (wheel,) = tmp.glob("cardsegment-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_ships_the_library_without_studies_or_the_gpu_run(tmp_path):
    pytest.importorskip("setuptools")
    names = zipfile.ZipFile(_built_wheel(tmp_path)).namelist()
    packages: Dict[str, int] = {}
    for n in names:
        top = "/".join(n.split("/")[:2])
        packages[top] = packages.get(top, 0) + 1
    assert "cardseg_train/calibration" in packages and "cardseg_train/commands" in packages
    assert "cardseg/segment.py" in names
    assert not [n for n in names if n.startswith("cardseg_train/studies/")], "the studies are in the wheel"
    assert not [n for n in names if n.startswith("cardseg_gpu/")], "the GPU run is in the wheel"
    assert not [n for n in names if n.startswith("Testing/")]

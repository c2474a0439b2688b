"""One place validates a bundle: the schema of ``bundle.json``, the weight files, the network shapes.

Every broken bundle must end in one line (``cardseg: error: ...``, exit code 2) that names the
file and the key, before any output is written and without changing the bundle.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cardseg.bundle import calibration_schema, schema as bundle_schema
from cardseg.bundle.loading import load_bundle, save_bundle, update_config
from cardseg.bundle.folder import BUNDLES_DIR, DEFAULT_NAME, check_bundle_folder, read_config
from cardseg.bundle.weights import read_safetensors_header
from cardseg.bundle.schema import validate_config
from cardseg.base.files import sha256_file
from cardseg.cli import main
from cardseg.base.errors import CardsegError

SHIPPED = BUNDLES_DIR / DEFAULT_NAME
DROP = object()  # as a value: remove the key
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# helpers


def _edit(cfg: dict, path: tuple, value) -> dict:
    """A deep copy of ``cfg`` with the key at ``path`` (keys and list indices) set or removed."""
    cfg = copy.deepcopy(cfg)
    *parents, last = path
    node = cfg
    for key in parents:
        node = node[key]
    if value is DROP:
        del node[last]
    else:
        node[last] = value
    return cfg


def _write_config(bundle: Path, cfg: dict) -> None:
    (bundle / "bundle.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")


def _copy(tiny_bundle: Path, dest: Path) -> Path:
    shutil.copytree(tiny_bundle, dest)
    return dest


def _snapshot(folder: Path) -> dict:
    """Every file below ``folder`` with its bytes (symlinks as their targets)."""
    return {
        str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


class _Touch:
    """Unpickling this creates ``path``: the trap a pickled weight file must never spring."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _pickle_trap(weights: Path, marker: Path) -> None:
    """A torch checkpoint (zip of pickles) whose loading would create ``marker``."""
    torch.save({"weight": torch.zeros(3), "trap": _Touch(marker)}, weights)


def _plant_pickle(bundle: Path, marker: Path) -> None:
    """Replace the primary's weights by a pickle trap, with its sha256 recorded so the checksum passes."""
    weights = bundle / "primary.safetensors"
    _pickle_trap(weights, marker)
    cfg = read_config(bundle)
    cfg["networks"]["primary"]["sha256"] = sha256_file(weights)
    _write_config(bundle, cfg)


# ---------------------------------------------------------------------------------------------
# the schema on its own


def test_shipped_and_tiny_bundles_pass(tiny_bundle):
    assert validate_config(read_config(SHIPPED), SHIPPED)["id"]["name"] == "acdc"
    root, cfg = check_bundle_folder(tiny_bundle)
    assert root == tiny_bundle and cfg == read_config(tiny_bundle)


def test_check_bundle_folder_is_torch_free():
    code = (
        "import sys; from cardseg.bundle.folder import check_bundle_folder; check_bundle_folder(); "
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


BREAKAGES = [
    # (key path, new value or DROP, what the message must say)
    (("schema_version",), DROP, "schema_version is missing"),
    (("schema_version",), 2, "schema_version must be 1"),
    (("id", "name"), "", "id.name must be a non-empty string"),
    (("id", "version"), DROP, "id.version is missing"),
    (("classes",), [{"name": "background"}], "classes must be a list of at least 2"),
    (("classes", 2, "name"), DROP, "classes[2].name is missing"),
    (("classes", 3, "name"), "RV", 'classes[3].name repeats the class name "RV"'),
    (("classes", 1, "color"), [0.1, 0.2], "classes[1].color must be 3 numbers in [0, 1]"),
    (("classes", 1, "color"), [0.1, 0.2, 1.5], "classes[1].color[2] must be in [0, 1] (got 1.5)"),
    (("image_channels",), 3, "image_channels must be 1"),
    (("image_channels",), DROP, "image_channels is missing"),
    (("pixel_spacing_mm",), 0, "pixel_spacing_mm must be in [0.1, 20] (got 0)"),
    (("pixel_spacing_mm",), "3", 'pixel_spacing_mm must be a number (got "3")'),
    (("pixel_spacing_mm",), float("nan"), "pixel_spacing_mm must be finite"),
    (("input_size",), 0, "input_size must be in [16, 1024] (got 0)"),
    (("input_size",), 64.0, "input_size must be an integer (got 64.0)"),
    (("input_size",), True, "input_size must be an integer (got true)"),
    (("preprocessing",), DROP, "preprocessing is missing"),
    (
        ("preprocessing", "normalization"),
        "volume-zscore",
        "preprocessing.normalization must be one of slice-percentile",
    ),
    (("preprocessing", "low_percentile"), DROP, "preprocessing.low_percentile is missing"),
    (("preprocessing", "low_percentile"), 99.6, "preprocessing.high_percentile must be > low_percentile (99.6)"),
    (("preprocessing", "high_percentile"), 101, "preprocessing.high_percentile must be in [0, 100] (got 101)"),
    (("preprocessing", "pad_value"), 1.0, "preprocessing.pad_value must be 0"),
    (("diffusion", "schedule"), "linear", "diffusion.schedule must be one of cosine"),
    (("diffusion", "num_steps"), 1, "diffusion.num_steps must be in [2, 10000] (got 1)"),
    (("diffusion", "s"), 0, "diffusion.s must be in (0, 1] (got 0)"),
    (("diffusion", "s"), DROP, "diffusion.s is missing"),
    (("diffusion", "sampled_steps"), DROP, "diffusion.sampled_steps is missing"),
    (("diffusion", "sampled_steps"), [], "diffusion.sampled_steps must be a non-empty list"),
    (("diffusion", "sampled_steps"), [50, 0], "diffusion.sampled_steps[0] must be in [0, 49] (got 50)"),
    (("diffusion", "sampled_steps"), [0, 12], "diffusion.sampled_steps must be distinct and in decreasing order"),
    (("diffusion", "sampled_steps"), [12, 12, 0], "diffusion.sampled_steps must be distinct and in decreasing"),
    (("networks", "reference"), DROP, "networks.reference is missing"),
    (("networks", "primary", "arch"), "resnet", "networks.primary.arch must be one of time-swinunetr, time-unet"),
    (("networks", "reference", "size"), "huge", "networks.reference.size must be one of micro, tiny, small, medium"),
    (("networks", "primary", "size"), DROP, "networks.primary.size is missing"),
    (("networks", "primary", "channels"), [16], "networks.primary.channels must be a list of at least 2 widths"),
    (("networks", "primary", "file"), DROP, "networks.primary.file is missing"),
    (("networks", "primary", "file"), "../../etc/passwd", "networks.primary.file must be a plain file name"),
    (("networks", "primary", "file"), "/etc/passwd", "networks.primary.file must be a plain file name"),
    (("networks", "primary", "file"), "..", "networks.primary.file must be a plain file name"),
    (("networks", "primary", "file"), "C:weights", "networks.primary.file must be a plain file name"),
    (("networks", "primary", "file"), "sub\\primary.safetensors", "networks.primary.file must be a plain file name"),
    (("networks", "primary", "file"), "", "networks.primary.file must be a plain file name"),
    (("networks", "reference", "file"), "nothere.safetensors", "names a missing weight file nothere.safetensors"),
    (("networks", "primary", "sha256"), "AB" * 32, "networks.primary.sha256 must be 64 lowercase hexadecimal"),
    (("networks", "primary", "sha256"), DROP, "networks.primary.sha256 is missing"),
    (("networks", "primary", "dtype"), "int8", "networks.primary.dtype must be one of float16"),
    (("calibration", "method"), "platt", "calibration.method must be one of uc, ts, ets, hts, card"),
    (("calibration", "tau_min"), DROP, "calibration.tau_min is missing"),
    (("calibration", "tau_min"), 0, "calibration.tau_min must be in [1, 1000] (got 0)"),
    (("calibration", "tau_max"), 0.5, "calibration.tau_max must be in [1, 1000] (got 0.5)"),
    (("calibration", "tau_max"), float("inf"), "calibration.tau_max must be finite"),
    (("calibration", "w_b"), -0.1, "calibration.w_b must be in [0, ln 2 = 0.6931] (got -0.1)"),
    (("calibration", "w_k"), 0, "calibration.w_k must be in [1e-06, ln 2 = 0.6931] (got 0)"),
    (("calibration", "temperature"), 2.0, "calibration.temperature is not a parameter of the card calibration"),
    (("calibration",), {"method": "ts"}, "calibration.temperature is missing"),
    (("calibration",), {"method": "ts", "temperature": 0}, "calibration.temperature must be in [0.01, 1000] (got 0)"),
    (
        ("calibration",),
        {"method": "ets", "temperature": 1.0, "w0": 0.5, "w1": 0.2, "w2": 0.2},
        "calibration weights w0 + w1 + w2 must sum to 1",
    ),
    (
        ("calibration",),
        {"method": "ets", "temperature": 1.0, "w0": 1.5, "w1": -0.5, "w2": 0.0},
        "calibration.w0 must be in [0, 1] (got 1.5)",
    ),
    (("calibration",), {"method": "hts", "w": 0.1}, "calibration.b is missing"),
    (("calibration",), {"method": "hts", "w": 0.1, "b": "x"}, "calibration.b must be a number"),
    (
        ("calibration", "tac_steps"),
        [5],
        "calibration.tac_steps[0] must be one of the sampled steps [49, 37, 24, 12, 0]",
    ),
    (("calibration", "tac_steps"), [], "calibration.tac_steps must be null or a non-empty list"),
    (("calibration", "fitted"), "yes", "calibration.fitted must be true or false"),
    (("baselines",), {"ts": {"method": "ts", "temperature": -1}}, "baselines.ts.temperature must be in [0.01, 1000]"),
    (("baselines",), {"ts": {"method": "hts", "w": 0.1, "b": 0.8}}, 'baselines.ts.method must be "ts"'),
    (("regions",), DROP, "regions is missing"),
    (("regions", "flag_threshold"), 0.8, "regions.flag_threshold must be in [0, ln 2"),
    (("regions", "flag_threshold"), -0.1, "regions.flag_threshold must be in [0, ln 2"),
    (("regions", "min_voxels"), 0, "regions.min_voxels must be >= 1 (got 0)"),
    (("regions", "map"), "entropy", "regions.map must be one of tac, tac_flips, error_probability"),
    (
        ("regions", "map"),
        "error_probability",
        "regions.voxel_model must be a fitted voxel model for the error_probability map",
    ),
    (("regions", "ranking"), "size", "regions.ranking must be one of p_error, p_error_per_ml, summed_map"),
    (("regions", "fill_holes"), "yes", "regions.fill_holes must be true or false"),
    (("regions", "grow_threshold"), 0.9, "regions.grow_threshold must be in"),
    (("regions", "display_max_disagreement"), 0.0, "regions.display_max_disagreement must be in (0"),
    (("agreement", "roi_dilation_px"), -1, "agreement.roi_dilation_px must be >= 0 (got -1)"),
    (("agreement", "roi_dilation_px"), DROP, "agreement.roi_dilation_px is missing"),
    (("agreement", "out_of_domain_threshold"), 1.5, "agreement.out_of_domain_threshold must be in [0, 1] (got 1.5)"),
    (("provenance",), "somewhere", "provenance must be an object"),
]


@pytest.mark.parametrize(
    "path, value, message",
    BREAKAGES,
    ids=[".".join(map(str, p)) + f"={'DROP' if v is DROP else v!r}"[:40] for p, v, _ in BREAKAGES],
)
def test_each_single_breakage_is_refused_in_one_line(tiny_bundle, path, value, message):
    cfg = _edit(read_config(tiny_bundle), path, value)
    with pytest.raises(CardsegError) as info:
        validate_config(cfg, tiny_bundle)
    text = str(info.value)
    assert text.startswith(f"{tiny_bundle / 'bundle.json'}: "), text
    assert message in text and "\n" not in text, text


def test_not_an_object_and_optional_keys(tiny_bundle):
    with pytest.raises(CardsegError, match="must hold a JSON object"):
        validate_config([1, 2], tiny_bundle)
    cfg = read_config(tiny_bundle)
    for path, value in (
        (("provenance",), DROP),
        (("baselines",), None),
        (("calibration", "tac_steps"), None),
        (("calibration", "tac_steps"), [12, 0]),
        (("agreement", "out_of_domain_threshold"), DROP),
        (("classes", 1, "color"), DROP),
        (("preprocessing", "pad_value"), DROP),
    ):
        validate_config(_edit(cfg, path, value), tiny_bundle)
    assert validate_config(cfg, tiny_bundle, label="somewhere/bundle.json") is cfg
    with pytest.raises(CardsegError, match=r"^somewhere/bundle.json: input_size"):
        validate_config(_edit(cfg, ("input_size",), 0), tiny_bundle, label="somewhere/bundle.json")


def test_every_fitted_calibrator_round_trips_through_the_schema(tiny_bundle):
    from cardseg.method.calibration import REGISTRY

    cfg = read_config(tiny_bundle)
    fitted = {
        "card": {"tau_min": 1.0, "tau_max": 5.0, "w_b": 0.0, "w_k": 0.01},
        "ts": {"temperature": 1.7},
        "ets": {"temperature": 2.0, "w0": 0.7, "w1": 0.2, "w2": 0.1},
        "hts": {"w": -0.3, "b": 1.2},
        "uc": {},
    }
    for method, params in fitted.items():
        cal = REGISTRY[method](**params).to_dict()
        validate_config({**cfg, "calibration": {**cal, "fitted": True}, "baselines": {method: cal}}, tiny_bundle)


def test_error_probability_regions_are_checked_as_probabilities(tiny_bundle):
    """An error-map rule (2.1.0's, as fit-review wrote it: the shipped bundles since 2.2.0 cut their
    regions from the TAC): thresholds on [0, 1], a voxel model checked like the region model."""
    record = ROOT / "Training" / "results" / "acdc-2.1.0" / "review" / "covered-v2" / "review_fit.json"
    rule = {k: v for k, v in json.loads(record.read_text(encoding="utf-8"))["block"].items() if k != "previous"}
    assert rule["map"] == "error_probability" and rule["voxel_model"]["coef"]
    cfg = _edit(read_config(tiny_bundle), ("regions",), {**rule, "flag_threshold": 0.9, "grow_threshold": 0.8})
    validate_config(cfg, tiny_bundle)  # above ln 2: fine for a probability
    for path, value, message in (
        (("regions", "flag_threshold"), 1.2, "regions.flag_threshold must be in [0, 1]"),
        (("regions", "voxel_model", "coef"), [0.1], "regions.voxel_model.coef must be a list"),
        (("regions", "voxel_model", "kind"), "tree", "regions.voxel_model must be null or a"),
        (("regions", "model", "platt"), [1.0], "regions.model.platt must be null or [a, b]"),
        (("regions", "model", "platt"), [-1.0, 0.0], "regions.model.platt[0] must be > 0"),
    ):
        with pytest.raises(CardsegError) as info:
            validate_config(_edit(cfg, path, value), tiny_bundle)
        assert message in str(info.value), str(info.value)


def test_name_lists_are_in_sync_with_the_engine():
    from cardseg.method.calibration import REGISTRY
    from cardseg.method.networks import ARCHES, SWIN_SIZES, UNET_SIZES

    assert set(bundle_schema.NETWORK_SIZES) == set(ARCHES)
    assert bundle_schema.NETWORK_SIZES["time-swinunetr"] == tuple(SWIN_SIZES)
    assert bundle_schema.NETWORK_SIZES["time-unet"] == tuple(UNET_SIZES)
    assert set(calibration_schema.CALIBRATION_PARAMS) == set(REGISTRY)
    from cardseg.review import error_map, regions

    assert (
        bundle_schema.REGION_FEATURES == regions.FEATURES and bundle_schema.VOXEL_FEATURES == error_map.VOXEL_FEATURES
    )
    assert bundle_schema.REGION_MAPS == regions.MAPS and bundle_schema.REGION_RANKINGS == regions.RANKINGS
    for method, cls in REGISTRY.items():
        assert tuple(cls().params()) == calibration_schema.CALIBRATION_PARAMS[method], method


# ---------------------------------------------------------------------------------------------
# weight files: inside the folder, regular, safetensors


def test_weight_files_must_lie_inside_the_bundle_folder(tiny_bundle, tmp_path):
    bundle = _copy(tiny_bundle, tmp_path / "b")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(bundle / "primary.safetensors", outside)
    (bundle / "primary.safetensors").unlink()
    (bundle / "primary.safetensors").symlink_to(outside)
    with pytest.raises(CardsegError, match=r"networks.primary.file must lie inside the bundle folder"):
        check_bundle_folder(bundle)
    # a link that stays inside the folder is fine
    (bundle / "primary.safetensors").unlink()
    shutil.copy(outside, bundle / "weights-p.safetensors")
    (bundle / "primary.safetensors").symlink_to("weights-p.safetensors")
    check_bundle_folder(bundle)
    (bundle / "primary.safetensors").unlink()
    (bundle / "primary.safetensors").mkdir()
    with pytest.raises(CardsegError, match=r"networks.primary.file names primary.safetensors, which is not a regular"):
        check_bundle_folder(bundle)


def test_a_pickle_is_refused_without_being_unpickled(tiny_bundle, tmp_path):
    # the trap is armed: loading such a file the pickle way does create its marker
    armed = tmp_path / "armed"
    _pickle_trap(tmp_path / "armed.pt", armed)
    torch.load(tmp_path / "armed.pt", weights_only=False)
    assert armed.exists()

    bundle = _copy(tiny_bundle, tmp_path / "b")
    marker = tmp_path / "unpickled"
    _plant_pickle(bundle, marker)
    for check in (check_bundle_folder, load_bundle):
        with pytest.raises(CardsegError, match=r"primary.safetensors: not a safetensors file") as info:
            check(bundle)
        assert "\n" not in str(info.value)
    assert not marker.exists()


def _safetensors_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "no valid header length"),
        (b"\x80\x04\x95" + b"\x00" * 40, "no valid header length"),  # a plain pickle
        ((6).to_bytes(8, "little") + b"[1, 2]", "not a JSON object"),
        ((4).to_bytes(8, "little") + b"{no ", "not JSON"),
        (_safetensors_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b""), "outside the file"),
        (_safetensors_bytes({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)), "does not match"),
        (_safetensors_bytes({"w": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)), "unknown dtype"),
        (_safetensors_bytes({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8)), "bad shape"),
        (_safetensors_bytes({"w": [1]}, bytes(8)), "entry is not an object"),
    ],
)
def test_safetensors_header_parser_refuses_what_is_not_safetensors(tmp_path, content, why):
    path = tmp_path / "w.safetensors"
    path.write_bytes(content)
    with pytest.raises(CardsegError, match=f"not a safetensors file .*{why}"):
        read_safetensors_header(path)


def test_safetensors_header_parser_reads_real_files(tiny_bundle):
    from safetensors import safe_open

    path = tiny_bundle / "reference.safetensors"
    header = read_safetensors_header(path)
    with safe_open(str(path), "pt") as f:
        assert {k: list(f.get_slice(k).get_shape()) for k in f.keys()} == {k: v["shape"] for k, v in header.items()}


# ---------------------------------------------------------------------------------------------
# load_bundle: shapes against the network bundle.json describes


@pytest.mark.parametrize("classes, held", [(3, 4), (5, 4)])
def test_a_class_count_mismatch_is_named_before_loading(tiny_bundle, tmp_path, classes, held):
    bundle = _copy(tiny_bundle, tmp_path / "b")
    cfg = read_config(bundle)
    names = [{"name": f"c{i}"} for i in range(classes)]
    _write_config(bundle, {**cfg, "classes": names})
    with pytest.raises(CardsegError) as info:
        load_bundle(bundle)
    assert str(info.value) == (
        f"{bundle}: bundle.json lists {classes} classes but primary.safetensors holds a network for {held} classes"
    )


def test_other_shape_mismatches_name_the_tensor(tiny_bundle, tmp_path):
    bundle = _copy(tiny_bundle, tmp_path / "b")
    cfg = read_config(bundle)
    _write_config(bundle, _edit(cfg, ("networks", "reference", "size"), "tiny"))  # the file holds a micro U-Net
    with pytest.raises(
        CardsegError,
        match=r"reference.safetensors: weights do not fit the time-unet:tiny network "
        r"that bundle.json describes \(tensor '.*' has shape \[.*\], the network "
        r"needs \[.*\]\)$",
    ):
        load_bundle(bundle)
    _write_config(bundle, _edit(cfg, ("networks", "reference", "size"), "small"))  # one level more
    with pytest.raises(CardsegError, match=r"reference.safetensors: weights do not fit .*is missing"):
        load_bundle(bundle)


def test_input_size_must_suit_the_networks(tiny_bundle, tmp_path):
    bundle = _copy(tiny_bundle, tmp_path / "b")
    _write_config(bundle, _edit(read_config(bundle), ("input_size",), 68))
    with pytest.raises(CardsegError, match=r"bundle.json: input_size must be a multiple of 8 for the primary"):
        load_bundle(bundle)


def test_update_config_refuses_a_change_that_breaks_the_bundle(tiny_bundle, tmp_path):
    bundle = _copy(tiny_bundle, tmp_path / "b")
    before = _snapshot(bundle)
    with pytest.raises(CardsegError, match=r"calibration.tau_min must be in \[1, 1000\] \(got 0.5\)"):
        update_config(bundle, {"calibration": {"tau_min": 0.5}})
    with pytest.raises(CardsegError, match=r"calibration.tac_steps\[0\] must be one of the sampled steps"):
        update_config(bundle, {"calibration": {"tac_steps": [5]}})
    assert _snapshot(bundle) == before
    update_config(bundle, {"calibration": {"tac_steps": [12, 0]}})
    assert load_bundle(bundle).tac_steps == [12, 0]


def test_save_bundle_refuses_an_invalid_config(tiny_bundle, tmp_path):
    b = load_bundle(tiny_bundle)
    cfg = _edit(b.config, ("calibration", "w_k"), 0.0)
    label = re.escape(str(tmp_path / "new" / "bundle.json"))
    with pytest.raises(CardsegError, match=rf"^{label}: calibration.w_k must be in \[1e-06, ln 2"):
        save_bundle(tmp_path / "new", cfg, b.primary, b.reference)
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# the real command line


def _break(kind: str, bundle: Path, tmp_path: Path) -> None:
    """Apply one of the defects of issue 9 to a copy of a bundle."""
    if kind == "pickle":
        _plant_pickle(bundle, tmp_path / "unpickled")
        return
    cfg = read_config(bundle)
    edits = {
        "no-preprocessing": (("preprocessing",), DROP),
        "no-sampled-steps": (("diffusion", "sampled_steps"), DROP),
        "no-class-name": (("classes", 1, "name"), DROP),
        "tau-min-0": (("calibration", "tau_min"), 0),
        "no-tau-min": (("calibration", "tau_min"), DROP),
        "input-size-0": (("input_size",), 0),
        "spacing-0": (("pixel_spacing_mm",), 0),
        "passwd": (("networks", "primary", "file"), "../../etc/passwd"),
        "3-classes": (("classes",), cfg["classes"][:3]),
    }
    path, value = edits[kind]
    _write_config(bundle, _edit(cfg, path, value))


CLI_CASES = {
    "pickle": "primary.safetensors: not a safetensors file",
    "no-preprocessing": "bundle.json: preprocessing is missing",
    "no-sampled-steps": "bundle.json: diffusion.sampled_steps is missing",
    "no-class-name": "bundle.json: classes[1].name is missing",
    "tau-min-0": "bundle.json: calibration.tau_min must be in [1, 1000] (got 0)",
    "no-tau-min": "bundle.json: calibration.tau_min is missing",
    "input-size-0": "bundle.json: input_size must be in [16, 1024] (got 0)",
    "spacing-0": "bundle.json: pixel_spacing_mm must be in [0.1, 20] (got 0)",
    "passwd": "bundle.json: networks.primary.file must be a plain file name inside the bundle folder",
    "3-classes": "bundle.json lists 3 classes but primary.safetensors holds a network for 4 classes",
}


def _broken_copy(tiny_bundle: Path, tmp_path: Path, kind: str) -> tuple:
    bundle = _copy(tiny_bundle, tmp_path / "broken")
    _break(kind, bundle, tmp_path)
    return bundle, _snapshot(bundle)


def _assert_refused(stderr: str, message: str, out: Path, bundle: Path, before: dict) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cardseg: error: "), stderr
    assert message in lines[0] and "Traceback" not in stderr, stderr
    assert not out.exists()
    assert _snapshot(bundle) == before


@pytest.mark.parametrize("kind", sorted(CLI_CASES))
def test_segment_refuses_each_broken_bundle_in_one_line(tiny_bundle, rotated_nifti, tmp_path, capsys, kind):
    bundle, before = _broken_copy(tiny_bundle, tmp_path, kind)
    out = tmp_path / "out"
    rc = main(["segment", str(rotated_nifti), "-o", str(out), "--bundle", str(bundle)])
    _assert_refused(capsys.readouterr().err, CLI_CASES[kind], out, bundle, before)
    assert rc == 2
    assert not (tmp_path / "unpickled").exists()


def test_info_refuses_a_broken_bundle_in_one_line(tiny_bundle, tmp_path, capsys):
    bundle, before = _broken_copy(tiny_bundle, tmp_path, "tau-min-0")
    assert main(["info", "--bundle", str(bundle)]) == 2
    _assert_refused(capsys.readouterr().err, CLI_CASES["tau-min-0"], tmp_path / "none", bundle, before)


@pytest.mark.parametrize("kind", ["pickle", "passwd", "3-classes", "spacing-0"])
def test_segment_subprocess_refuses_broken_bundles(tiny_bundle, rotated_nifti, tmp_path, kind):
    """The real ``python -m cardseg`` process: exit code 2, one line on stderr, nothing written."""
    bundle, before = _broken_copy(tiny_bundle, tmp_path, kind)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "cardseg", "segment", str(rotated_nifti), "-o", str(out), "--bundle", str(bundle)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    _assert_refused(proc.stderr, CLI_CASES[kind], out, bundle, before)
    assert not (tmp_path / "unpickled").exists()


# ---------------------------------------------------------------------------------------------
# provenance: names and relative paths only


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_shipped_bundle_records_no_machine_paths():
    bad = [
        s
        for s in _strings(read_config(SHIPPED))
        if s.startswith(("/", "\\", "~"))
        or re.match(r"[A-Za-z]:[\\/]", s)
        or any(part in s for part in ("/root", "/work", "/home", "/Users", "/tmp"))
    ]
    assert bad == []


def test_provenance_names_data_and_runs_not_their_folders(tmp_path):
    from cardseg_train.training.config import data_name, is_machine_path

    data = tmp_path / "acdc"
    data.mkdir()
    assert data_name(data, "acdc-h5") == "acdc (ACDC HDF5 layout)"
    assert data_name(str(data) + "/", None) == "acdc"
    assert data_name("synthetic", "synthetic") == "synthetic"
    assert all(is_machine_path(p) for p in ("/work/shared/data/acdc", "C:\\data", "\\\\server\\share"))
    assert not any(is_machine_path(p) for p in ("acdc (ACDC HDF5 layout)", "synthetic", "primary-mini"))


def test_exported_provenance_holds_names_even_from_old_run_summaries(tmp_path):
    from cardseg_train.training.export import _run_provenance
    from cardseg_train.training.config import TrainConfig

    run = tmp_path / "runs" / "primary-mini"
    run.mkdir(parents=True)
    old = {"data": "/work/shared/data/acdc", "format": "acdc-h5", "steps_done": 5}  # as summaries were written
    (run / "summary.json").write_text(json.dumps(old), encoding="utf-8")
    prov = _run_provenance(run, TrainConfig(data="/elsewhere/acdc", data_format="acdc-h5"), {"step": 5}, "last")
    assert prov["run"] == "primary-mini" and prov["data"] == "acdc (ACDC HDF5 layout)"
    (run / "summary.json").write_text(json.dumps({**old, "data": "acdc (ACDC HDF5 layout)"}), encoding="utf-8")
    assert _run_provenance(run, TrainConfig(), {"step": 5}, "last")["data"] == "acdc (ACDC HDF5 layout)"

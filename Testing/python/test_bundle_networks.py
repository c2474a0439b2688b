import json
import os
import shutil

import pytest
import torch

from cardseg.bundle.loading import load_bundle, update_config
from cardseg.bundle.folder import read_config, resolve_bundle_path
from cardseg.base.errors import CardsegError
from cardseg.method.networks import SWIN_SIZES, build_network, count_parameters


def test_bundle_loads_with_verified_checksums(tiny_bundle):
    b = load_bundle(tiny_bundle)
    assert b.class_names == ["background", "RV", "MYO", "LV"]
    assert b.sampled_steps == [49, 37, 24, 12, 0]
    assert set(b.checksums) == {"primary.safetensors", "reference.safetensors"}
    cfg = b.config
    for key in (
        "schema_version",
        "id",
        "pixel_spacing_mm",
        "input_size",
        "preprocessing",
        "diffusion",
        "calibration",
        "regions",
        "agreement",
        "provenance",
    ):
        assert key in cfg
    assert cfg["agreement"]["roi_dilation_px"] == 10 and cfg["agreement"]["out_of_domain_threshold"] is None
    assert not b.primary.training


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path):
    dest = tmp_path / "b"
    shutil.copytree(tiny_bundle, dest)
    return dest


def test_tampered_weights_are_refused(bundle_copy):
    w = bundle_copy / "primary.safetensors"
    data = bytearray(w.read_bytes())
    data[-10] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(CardsegError, match="checksum mismatch"):
        load_bundle(bundle_copy)


def test_truncated_and_missing_weights_are_refused(bundle_copy):
    w = bundle_copy / "reference.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(CardsegError, match="checksum mismatch"):
        load_bundle(bundle_copy)
    w.unlink()
    with pytest.raises(CardsegError, match="missing weight file"):
        load_bundle(bundle_copy)


def test_weights_that_do_not_fit_are_refused_even_with_matching_checksum(bundle_copy, tiny_bundle):
    cfg = json.loads((bundle_copy / "bundle.json").read_text(encoding="utf-8"))
    cfg["networks"]["primary"]["size"] = "small"  # the file holds a tiny U-Net
    (bundle_copy / "bundle.json").write_text(json.dumps(cfg))
    with pytest.raises(CardsegError, match="do not fit"):
        load_bundle(bundle_copy)


def test_bad_schema_and_not_a_bundle(bundle_copy, tmp_path):
    cfg = json.loads((bundle_copy / "bundle.json").read_text(encoding="utf-8"))
    cfg["schema_version"] = 99
    (bundle_copy / "bundle.json").write_text(json.dumps(cfg))
    with pytest.raises(CardsegError, match="schema_version"):
        load_bundle(bundle_copy)
    (bundle_copy / "bundle.json").write_text("{not json")
    with pytest.raises(CardsegError, match="unreadable"):
        load_bundle(bundle_copy)
    with pytest.raises(CardsegError, match="not a bundle"):
        load_bundle(tmp_path)


def test_environment_variable_selects_the_bundle(tiny_bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("CARDSEG_BUNDLE", str(tiny_bundle))
    assert resolve_bundle_path() == tiny_bundle
    monkeypatch.setenv("CARDSEG_BUNDLE", str(tmp_path))  # an explicit path wins over the variable
    assert resolve_bundle_path(tiny_bundle) == tiny_bundle
    with pytest.raises(CardsegError, match="not a bundle"):
        resolve_bundle_path()


def test_update_config_rewrites_json_only(bundle_copy):
    before = {p.name: p.read_bytes() for p in bundle_copy.glob("*.safetensors")}
    update_config(bundle_copy, {"calibration": {"tau_max": 7.5, "fitted": True}})
    cfg = read_config(bundle_copy)
    assert cfg["calibration"]["tau_max"] == 7.5 and cfg["calibration"]["method"] == "card"
    assert {p.name: p.read_bytes() for p in bundle_copy.glob("*.safetensors")} == before
    assert load_bundle(bundle_copy).calibrator.tau_max == 7.5
    # written through a temporary file, yet readable by others as any file under the umask
    umask = os.umask(0)
    os.umask(umask)
    assert (bundle_copy / "bundle.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_saved_bundle_files_get_the_usual_modes(tiny_bundle):
    umask = os.umask(0)
    os.umask(umask)
    assert tiny_bundle.stat().st_mode & 0o777 == 0o777 & ~umask  # made through tempfile.mkdtemp (0700)
    for f in tiny_bundle.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f.name


@pytest.mark.parametrize(
    "spec",
    [
        {"arch": "time-swinunetr", "size": "mini"},
        {"arch": "time-unet", "size": "micro"},
    ],
)
def test_denoisers_use_image_state_and_step(spec):
    torch.manual_seed(0)
    net = build_network({**spec, "num_classes": 4}).eval()
    with torch.no_grad():  # FiLM starts at identity: randomise everything to expose dependencies
        for p in net.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    img, state = torch.randn(1, 1, 64, 64), torch.rand(1, 4, 64, 64)
    out = net(img, state, torch.tensor([3]))
    assert out.shape == (1, 4, 64, 64)
    assert not torch.allclose(out, net(img, state, torch.tensor([40])))
    assert not torch.allclose(out, net(img * 2, state, torch.tensor([3])))
    assert not torch.allclose(out, net(img, state.flip(1), torch.tensor([3])))


def test_size_registry_spans_the_paper_sweep():
    counts = {
        s: count_parameters(build_network({"arch": "time-swinunetr", "size": s, "num_classes": 4}))
        for s in ("mini", "base")
    }
    assert 1.5e6 < counts["mini"] < 1.9e6  # paper's Mini reference: 1.74M
    assert 35e6 < counts["base"] < 42e6  # paper's primary: 37.21M
    assert list(SWIN_SIZES) == ["mini", "tiny", "small", "base", "large"]
    disc = build_network({"arch": "discriminative", "backbone": "unet", "num_classes": 4})
    assert disc(torch.randn(1, 1, 32, 32)).shape == (1, 4, 32, 32)
    with pytest.raises(ValueError):
        build_network({"arch": "time-swinunetr", "size": "huge", "num_classes": 4})

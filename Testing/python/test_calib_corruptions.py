"""ACDC-C corruptions: deterministic, intensity-only, and motion is in-plane ringing, not a shift."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import ndimage

pytest.importorskip("torchio")

from cardseg.bundle.phantom import synthetic_cine_volume  # noqa: E402
from cardseg_train.data.corruptions import (
    CORRUPTIONS,
    corrupt_labelled_volume,
    corrupt_volume,  # noqa: E402
    corruption_params,
)


@pytest.fixture(scope="module")
def clean():
    vol, lab = synthetic_cine_volume(shape=(4, 96, 80), spacing=(1.6, 1.4, 8.0), seed=3, noise=0.0)
    return vol, lab


def max_ncc(a: np.ndarray, b: np.ndarray) -> float:
    """Largest normalised cross-correlation of two 2D images over all circular shifts."""
    a, b = a - a.mean(), b - b.mean()
    c = np.fft.ifft2(np.fft.fft2(a) * np.conj(np.fft.fft2(b))).real
    return float(c.max() / np.sqrt((a * a).sum() * (b * b).sum()))


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corruption_changes_image_keeps_layout_and_is_deterministic(clean, kind):
    vol, _ = clean
    a = vol.array
    c1 = corrupt_volume(a, kind, "patient001_frame01", vol.spacing)
    c2 = corrupt_volume(a, kind, "patient001_frame01", vol.spacing)
    c3 = corrupt_volume(a, kind, "patient002_frame01", vol.spacing)
    assert c1.shape == a.shape and c1.dtype == a.dtype
    assert np.array_equal(c1, c2)
    assert not np.array_equal(c1, c3)
    rel = np.abs(c1 - a).mean() / np.abs(a).mean()
    assert rel > 0.01, f"{kind} barely changed the image ({rel:.4f})"
    assert np.isfinite(c1).all()
    # positively homogeneous: applied in the volume's own intensity scale
    c_scaled = corrupt_volume(3.0 * a, kind, "patient001_frame01", vol.spacing)
    assert np.allclose(c_scaled, 3.0 * c1, rtol=1e-4, atol=1e-3 * np.abs(a).max())
    assert np.array_equal(a, vol.array)  # input untouched
    assert corruption_params(kind, "patient001_frame01") == corruption_params(kind, "patient001_frame01")


def test_motion_is_in_plane_ringing_not_a_shift(clean):
    vol, _ = clean
    a = np.pad(vol.array, ((0, 0), (32, 32), (32, 32)))  # room outside the body
    far = ~ndimage.binary_dilation(a > 1, structure=np.ones((1, 3, 3)), iterations=16)
    for case in ("patient001_frame01", "patient042_frame07", "patient090_frame11"):
        c = corrupt_volume(a, "motion", case, vol.spacing)
        for z in range(a.shape[0]):
            # not a translated copy of the slice
            assert max_ncc(a[z], c[z]) < 0.995
            # energy well outside the object's support (16 px > the largest rigid displacement)
            assert np.sqrt((c[z][far[z]] ** 2).mean()) > 0.005 * a[z][a[z] > 1].mean()
    # the trap this layout avoids: TorchIO motion on one (1, W, H, 1) slice is a rigid move
    import torchio as tio

    z = 2
    slice_img = tio.ScalarImage(tensor=torch.from_numpy(a[z].T.copy())[None, :, :, None])
    moved = (
        tio.Motion(
            degrees=np.array([[0.0, 0.0, 4.0]]),
            translation=np.array([[3.0, -2.0, 0.0]]),
            times=np.array([0.5]),
            image_interpolation="linear",
        )(slice_img)
        .data[0, :, :, 0]
        .numpy()
        .T
    )
    assert max_ncc(a[z], moved) > 0.995


def test_motion_acts_slice_by_slice(clean):
    """In-plane movements only: corrupting one slice alone gives the same slice."""
    vol, _ = clean
    full = corrupt_volume(vol.array, "motion", "case-x", vol.spacing)
    one = corrupt_volume(vol.array[1:2], "motion", "case-x", vol.spacing)
    assert np.abs(full[1] - one[0]).max() < 1e-3 * np.abs(vol.array).max()


def test_labelled_volume_labels_untouched(clean):
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = clean
    item = LabelledVolume("p1_f1", "p1", vol, lab)
    out = corrupt_labelled_volume(item, "ghosting")
    assert out.labels is lab and out.case == "p1_f1:ghosting" and out.patient == "p1"
    assert out.volume.spacing == vol.spacing and not np.array_equal(out.volume.array, vol.array)
    with pytest.raises(ValueError):
        corrupt_volume(vol.array, "blur", "c")


def test_picture_clean_vs_corruptions(clean, tmp_path):
    """One PNG of a mid slice (CARDSEG_PICTURE_DIR keeps it for a look; never committed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vol, _ = clean
    z = vol.array.shape[0] // 2
    fig, ax = plt.subplots(1, 1 + len(CORRUPTIONS), figsize=(3 * (1 + len(CORRUPTIONS)), 3.4))
    vmax = float(np.percentile(vol.array, 99.5))
    ax[0].imshow(vol.array[z], cmap="gray", vmin=0, vmax=vmax)
    ax[0].set_title("clean")
    for i, kind in enumerate(CORRUPTIONS, 1):
        ax[i].imshow(corrupt_volume(vol.array, kind, "picture", vol.spacing)[z], cmap="gray", vmin=0, vmax=vmax)
        ax[i].set_title(kind)
    for a in ax:
        a.axis("off")
    out = os.path.join(os.environ.get("CARDSEG_PICTURE_DIR", str(tmp_path)), "corruptions_mid_slice.png")
    fig.savefig(out, dpi=60)
    plt.close(fig)
    assert os.path.getsize(out) > 1000


def test_evaluation_normalises_after_corrupting(clean, tiny_bundle, monkeypatch):
    """The paper's protocol: the artifact acts on the scanner's image and the bundle's own
    normalisation (whatever it is) runs on the corrupted volume, as it would on a user's file."""
    import cardseg.segment
    from cardseg.bundle.loading import load_bundle
    from cardseg_train.calibration import harness as ce
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = clean
    item = LabelledVolume("p1_f1", "p1", vol, lab)
    seen = []

    class Stop(Exception):
        pass

    def spy(volume, bundle):
        seen.append(np.array(volume.array))
        raise Stop

    monkeypatch.setattr(cardseg.segment, "normalized_slices", spy)
    bundle = load_bundle(tiny_bundle)
    for condition in ("clean", "spike"):
        with pytest.raises(Stop):
            ce.run_case(bundle, item, condition, ce.CaseRunOptions(seed=3))
    np.testing.assert_array_equal(seen[0], vol.array)
    np.testing.assert_array_equal(seen[1], ce.condition_volume(item, "spike", 3).volume.array)
    assert not np.array_equal(seen[1], vol.array)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_tio3d_protocol_is_torchio_default_seeded_per_case(clean, kind):
    """The ``tio3d`` protocol: TorchIO's random transform with default arguments on the 3D volume,
    deterministic per case, leaving the global random state alone, unlike the in-plane one."""
    vol, _ = clean
    a = vol.array
    state = torch.get_rng_state()
    c1 = corrupt_volume(a, kind, "patient001_frame01", vol.spacing, protocol="tio3d")
    assert torch.equal(torch.get_rng_state(), state)
    c2 = corrupt_volume(a, kind, "patient001_frame01", vol.spacing, protocol="tio3d")
    c3 = corrupt_volume(a, kind, "patient002_frame01", vol.spacing, protocol="tio3d")
    inplane = corrupt_volume(a, kind, "patient001_frame01", vol.spacing)
    assert c1.shape == a.shape and c1.dtype == a.dtype and np.isfinite(c1).all()
    assert np.array_equal(c1, c2) and not np.array_equal(c1, c3) and not np.allclose(c1, inplane)
    assert np.abs(c1 - a).mean() / np.abs(a).mean() > 1e-3
    # the same draw by hand: TorchIO's default transform on the (1, X, Y, Z) image, torch seeded
    import torchio as tio

    from cardseg_train.data.corruptions import corruption_rng

    cls = {
        "bias_field": tio.RandomBiasField,
        "motion": tio.RandomMotion,
        "ghosting": tio.RandomGhosting,
        "spike": tio.RandomSpike,
    }[kind]
    seed = int(corruption_rng("patient001_frame01", f"tio3d:{kind}", 0).integers(0, 2**63 - 1))
    image = tio.ScalarImage(
        tensor=torch.from_numpy(a.transpose(2, 1, 0).copy())[None], affine=np.diag([*map(float, vol.spacing), 1.0])
    )
    torch.manual_seed(seed)
    by_hand = cls()(tio.Subject(image=image))["image"].data[0].numpy().transpose(2, 1, 0)
    torch.set_rng_state(state)
    np.testing.assert_allclose(c1, by_hand, rtol=1e-5, atol=1e-5 * np.abs(a).max())


def test_tio3d_motion_mixes_slices(clean):
    """Unlike the in-plane protocol, 3D motion is not slice by slice."""
    vol, _ = clean
    full = corrupt_volume(vol.array, "motion", "case-x", vol.spacing, protocol="tio3d")
    one = corrupt_volume(vol.array[1:2], "motion", "case-x", vol.spacing, protocol="tio3d")
    assert np.abs(full[1] - one[0]).max() > 1e-2 * np.abs(vol.array).max()


def test_tio3d_conditions_are_named_and_cached_apart(clean):
    from cardseg_train.calibration.harness import ALL_CONDITIONS, CONDITIONS, CaseCache, condition_volume
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = clean
    assert (
        set(CONDITIONS) < set(ALL_CONDITIONS)
        and "tio3d:spike" in ALL_CONDITIONS
        and "tio3d:clean" not in ALL_CONDITIONS
    )
    item = LabelledVolume("p1_f1", "p1", vol, lab)
    a, b = condition_volume(item, "spike"), condition_volume(item, "tio3d:spike")
    assert a.case == "p1_f1:spike" and b.case == "p1_f1:tio3d:spike"
    assert not np.allclose(a.volume.array, b.volume.array)
    cache = CaseCache(Path("/tmp/somewhere"), "k")
    assert cache.path("p1_f1", "spike") != cache.path("p1_f1", "tio3d:spike")
    assert ":" not in cache.path("p1_f1", "tio3d:spike").name
    with pytest.raises(ValueError, match="protocol"):
        corrupt_volume(vol.array, "spike", "c", protocol="3d")

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from cardseg.io.preprocess import (
    SliceGrid,
    interpolation_matrix,
    network_to_slices,
    normalize_slice,
    resample_to_network,
    slices_to_network,
)


def test_normalize_slice_range_and_constant():
    img = np.random.default_rng(0).normal(100, 20, (40, 30)).astype(np.float32)
    n = normalize_slice(img)
    assert n.min() == 0.0 and n.max() == 1.0 and n.dtype == np.float32
    assert not normalize_slice(np.full((10, 10), 5.0)).any()


def test_grid_maps_physical_positions_consistently():
    """A point at a known mm offset from the slice centre lands at the same offset on the network grid."""
    ny, nx, sx, sy, s, n = 60, 80, 1.2, 0.9, 1.5, 64
    img = np.zeros((1, ny, nx), np.float32)
    img[0, 30 + 10, 40 - 20] = 1.0  # +9 mm in y, -24 mm in x from centre (29.5, 39.5) → (+0.5px)
    grid = SliceGrid((ny, nx), (sx, sy), s, n)
    out = resample_to_network(img, grid, mode="bilinear")[0, 0]
    yy, xx = np.unravel_index(out.argmax(), out.shape)
    cy = (n - 1) / 2 + (40 - (ny - 1) / 2) * sy / s
    cx = (n - 1) / 2 + (20 - (nx - 1) / 2) * sx / s
    assert abs(yy - cy) <= 1 and abs(xx - cx) <= 1


def test_round_trip_restores_a_smooth_map_inside_the_field_of_view():
    ny, nx = 50, 70
    yy, xx = np.mgrid[0:ny, 0:nx]
    smooth = np.sin(xx / 9.0) + np.cos(yy / 7.0)
    grid = SliceGrid((ny, nx), (1.0, 1.0), 0.8, 96)
    net = resample_to_network(smooth[None].astype(np.float32), grid)
    back = network_to_slices(net, grid)[0, 0]
    assert back.dtype == np.float32
    fov = grid.field_of_view()
    assert fov.all()  # 96 * 0.8 mm covers 70 mm
    assert np.abs(back - smooth)[2:-2, 2:-2].max() < 0.05


def test_field_of_view_when_the_slice_is_larger_than_the_grid():
    grid = SliceGrid((100, 100), (1.0, 1.0), 1.0, 64)
    fov = grid.field_of_view()
    assert fov[50, 50] and not fov[0, 0] and not fov[50, 99]
    assert fov.sum() == 64 * 64
    labels = np.zeros((1, 100, 100), np.float32)
    labels[0, 40:60, 40:60] = 3
    net = slices_to_network(labels, grid, mode="nearest")
    assert set(torch.unique(net).tolist()) == {0.0, 3.0}


def _grid_sample_grids(grid: SliceGrid):
    """torch ``grid_sample`` grids (normalised x, y; align_corners=True) for both directions."""
    ny, nx = grid.slice_shape
    sx, sy = grid.spacing
    s, n = grid.target_spacing, grid.size
    a = torch.arange(n, dtype=torch.float64) - (n - 1) / 2
    yy, xx = torch.meshgrid(a * s / sy * 2 / max(ny - 1, 1), a * s / sx * 2 / max(nx - 1, 1), indexing="ij")
    to_net = torch.stack([xx, yy], dim=-1)[None]
    ax = (n - 1) / 2 + (torch.arange(nx, dtype=torch.float64) - (nx - 1) / 2) * sx / s
    ay = (n - 1) / 2 + (torch.arange(ny, dtype=torch.float64) - (ny - 1) / 2) * sy / s
    yy, xx = torch.meshgrid(ay * 2 / (n - 1) - 1, ax * 2 / (n - 1) - 1, indexing="ij")
    return to_net, torch.stack([xx, yy], dim=-1)[None]


@settings(max_examples=25, deadline=None)
@given(
    st.integers(16, 90),
    st.integers(16, 90),
    st.floats(0.5, 2.5),
    st.floats(0.5, 2.5),
    st.floats(0.8, 2.0),
    st.integers(16, 64),
    st.integers(0, 1000),
)
def test_resampling_is_grid_samples_bilinear_with_zeros_in_and_border_out(ny, nx, sx, sy, s, n, seed):
    """The numpy resampling computes what torch's grid_sample (align_corners=True) does: zeros
    padding onto the network grid (after the same anti-aliasing), border padding back."""
    grid = SliceGrid((ny, nx), (sx, sy), s, n)
    rng = np.random.default_rng(seed)
    slices = rng.random((2, ny, nx)).astype(np.float32)
    to_net, to_slice = _grid_sample_grids(grid)
    sigma = grid.antialias_sigma()
    blurred = resample_to_network(slices, grid)
    smooth = (
        np.stack([ndimage.gaussian_filter(a, sigma=sigma, mode="nearest") for a in slices]) if max(sigma) else slices
    )
    # the float32 grids of the torch implementation this module replaced: equal to float32 rounding
    expect = F.grid_sample(
        torch.from_numpy(smooth.astype(np.float32))[:, None],
        to_net.float().expand(2, -1, -1, -1),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    ).numpy()
    assert np.abs(blurred - expect).max() < 1e-6
    maps = rng.normal(0, 10, (2, 3, n, n)).astype(np.float32)
    expect = F.grid_sample(
        torch.from_numpy(maps),
        to_slice.float().expand(2, -1, -1, -1),
        mode="bilinear",
        padding_mode="border",
        align_corners=True,
    ).numpy()
    assert np.abs(network_to_slices(maps, grid) - expect).max() < 2e-5


def test_slices_to_network_is_the_numpy_resampling_as_a_tensor():
    grid = SliceGrid((40, 30), (1.1, 0.9), 1.3, 32)
    slices = np.random.default_rng(3).random((2, 40, 30)).astype(np.float32)
    assert torch.equal(slices_to_network(slices, grid), torch.from_numpy(resample_to_network(slices, grid)))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(8, 90),
    st.integers(8, 90),
    st.floats(0.5, 2.5),
    st.floats(0.5, 2.5),
    st.floats(0.8, 2.0),
    st.integers(8, 64),
    st.integers(0, 1000),
)
def test_label_resampling_is_grid_samples_nearest_to_the_voxel(ny, nx, sx, sy, s, n, seed):
    """Labels go onto the network grid exactly as torch's nearest grid_sample put them (float32
    positions, ties rounded half to even): the labels the shipped models were trained on."""
    grid = SliceGrid((ny, nx), (sx, sy), s, n)
    labels = np.random.default_rng(seed).integers(0, 4, (2, ny, nx)).astype(np.float32)
    to_net, _ = _grid_sample_grids(grid)
    expect = F.grid_sample(
        torch.from_numpy(labels)[:, None],
        to_net.float().expand(2, -1, -1, -1),
        mode="nearest",
        padding_mode="zeros",
        align_corners=True,
    ).numpy()
    assert np.array_equal(resample_to_network(labels, grid, mode="nearest"), expect)


def test_a_whole_number_grid_rounds_ties_half_to_even():
    """Eight pixels read at 0.5, 1.5, ...: nearest takes the even neighbour, as grid_sample does."""
    grid = SliceGrid((1, 8), (1.0, 1.0), 1.0, 8)
    line = np.arange(8, dtype=np.float32)[None, None]
    w = interpolation_matrix(np.arange(8, dtype=np.float32) + 0.5, 8, nearest=True)
    assert (w @ line[0, 0]).tolist() == [0.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 0.0]
    assert resample_to_network(line, grid, mode="nearest")[0, 0, 0].tolist() == list(range(8))


def test_back_resampling_keeps_a_tensor_a_tensor_of_float32():
    grid = SliceGrid((40, 30), (1.1, 0.9), 1.3, 32)
    maps = np.random.default_rng(4).normal(0, 5, (2, 3, 32, 32)).astype(np.float32)
    as_numpy = network_to_slices(maps, grid)
    as_tensor = network_to_slices(torch.from_numpy(maps).double(), grid)
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float32
    assert isinstance(as_numpy, np.ndarray) and as_numpy.dtype == np.float32
    # torch's and numpy's float32 matmuls (different BLAS kernels) may round the last bit differently
    assert np.allclose(as_tensor.numpy(), as_numpy, rtol=1e-6, atol=1e-5)


def test_a_kept_cache_makes_the_interpolation_matrices_once_per_grid_and_device(monkeypatch):
    """A batch loop passes one dict: the matrices are built (and moved to a device) on the first
    call only; a second grid gets its own; the results equal the uncached ones exactly."""
    from cardseg.io import preprocess

    grid = SliceGrid((40, 30), (1.1, 0.9), 1.3, 32)
    other = SliceGrid((40, 30), (0.9, 1.1), 1.3, 32)  # same shapes, other positions
    maps = np.random.default_rng(5).normal(0, 5, (3, 2, 32, 32)).astype(np.float32)
    expect = {id(g): network_to_slices(maps, g) for g in (grid, other)}
    built = []
    real = preprocess.interpolation_matrix
    monkeypatch.setattr(preprocess, "interpolation_matrix", lambda *a, **k: built.append(1) or real(*a, **k))
    cache = {}
    for _ in range(3):
        for part in (maps[:2], maps[2:]):
            assert np.array_equal(
                network_to_slices(part, grid, cache),
                expect[id(grid)][: part.shape[0]] if part.shape[0] == 2 else expect[id(grid)][2:],
            )
    assert len(built) == 2  # rows and columns, once
    assert np.array_equal(network_to_slices(maps, other, cache), expect[id(other)])
    assert len(built) == 4
    as_tensor = network_to_slices(torch.from_numpy(maps), grid, cache)
    assert isinstance(as_tensor, torch.Tensor)
    assert np.allclose(as_tensor.numpy(), expect[id(grid)], rtol=1e-6, atol=1e-5)  # torch's BLAS, not numpy's
    assert len(built) == 6  # the tensors' own copies, once
    network_to_slices(torch.from_numpy(maps), grid, cache)
    assert len(built) == 6
    network_to_slices(maps, grid)  # no cache: built again
    assert len(built) == 8

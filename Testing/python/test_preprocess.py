import numpy as np
import torch

from cardseg.io.preprocess import SliceGrid, network_to_slices, normalize_slice, slices_to_network


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
    out = slices_to_network(img, grid, mode="bilinear")[0, 0].numpy()
    yy, xx = np.unravel_index(out.argmax(), out.shape)
    cy = (n - 1) / 2 + (40 - (ny - 1) / 2) * sy / s
    cx = (n - 1) / 2 + (20 - (nx - 1) / 2) * sx / s
    assert abs(yy - cy) <= 1 and abs(xx - cx) <= 1


def test_round_trip_restores_a_smooth_map_inside_the_field_of_view():
    ny, nx = 50, 70
    yy, xx = np.mgrid[0:ny, 0:nx]
    smooth = np.sin(xx / 9.0) + np.cos(yy / 7.0)
    grid = SliceGrid((ny, nx), (1.0, 1.0), 0.8, 96)
    net = slices_to_network(smooth[None].astype(np.float32), grid)
    back = network_to_slices(net, grid)[0, 0].numpy()
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

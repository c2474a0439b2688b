"""The extension's screenshots: the shipped model's real outputs on the module's sample data (the
synthetic phantom in ``CARDSegment/Resources/SampleData``; ACDC images may not be shown).

    python Resources/Screenshots/make_screenshots.py [--write-sample-data] [--python PY]

1. ``--write-sample-data`` first (re)writes the sample data with the project's phantom code
   (``phantom_sample.write_sample_files``, beside this script) and prints the SHA-256 values
   that ``CARDSegmentLib.install.sampledata.SAMPLE_FILES`` must then hold.
2. ``cardseg segment`` runs on the sample image with the shipped default bundle (a separate
   process: ``PY -m cardseg segment``, PY the running Python unless ``--python``), into a
   temporary folder.
3. Two composites of its outputs are drawn with matplotlib into this folder, the module's
   colours and windows (disagreement: Inferno from 0 to the bundle's validation maximum, as the module
   draws it, hidden below 0.01), and the run's
   report, reduced to what the images show, is written beside them as ``phantom-report.json``:

   * ``CARDSegment-phantom-overview.png``: the slice holding most of the first flagged region:
     image, segmentation, disagreement, flagged regions with their ``p_error``;
   * ``CARDSegment-phantom-review.png``: every slice, base to apex (segmentation outlines,
     disagreement, flagged regions), with the region table and the class volumes.

A PNG over 300 KB is reduced to a 256-colour palette.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODULE_DIR = REPO / "CARDSegment"
sys.path.insert(0, str(MODULE_DIR))

sys.path.insert(0, str(HERE))

import phantom_sample  # noqa: E402
from CARDSegmentLib.install import sampledata  # noqa: E402
from CARDSegmentLib.outputs.overlays import overlay_range, overlay_title  # noqa: E402

OVERVIEW = "CARDSegment-phantom-overview.png"
REVIEW = "CARDSegment-phantom-review.png"
REPORT = "phantom-report.json"
MAX_BYTES = 300 * 1024
LN2 = math.log(2.0)
SHOW_ABOVE = 0.01  # the module's display threshold of the disagreement overlay
REGION_COLOUR = "#39ff14"


def bundle_classes() -> list:
    bundle = json.loads((MODULE_DIR / "cardseg" / "bundles" / "acdc" / "bundle.json").read_text(encoding="utf-8"))
    return bundle["classes"]


def segment(image: Path, out_dir: Path, python: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(MODULE_DIR), os.environ.get("PYTHONPATH")])))
    subprocess.run(
        [python, "-m", "cardseg", "segment", str(image), "-o", str(out_dir), "--progress", "none"], env=env, check=True
    )
    return json.loads((out_dir / "report.json").read_text(encoding="utf-8"))


def read(path: Path):
    import SimpleITK as sitk

    return sitk.GetArrayFromImage(sitk.ReadImage(str(path)))


def reduced_report(report: dict) -> dict:
    """What the screenshots show, from the run's report.json (no local paths)."""
    keep = (
        "method",
        "agreement",
        "agreement_per_slice",
        "out_of_domain",
        "class_volumes_ml",
        "backend",
        "device",
        "disagreement_display_max",
    )
    out = {k: report[k] for k in keep if k in report}
    out["bundle"] = {k: report["bundle"][k] for k in ("id", "checksums")}
    out["regions"] = [
        {k: r[k] for k in ("id", "p_error", "voxels", "volume_mm3", "bbox_ijk", "classes", "mean_disagreement")}
        for r in report["regions"]
    ]
    out["input"] = "CARDSegment/Resources/SampleData/" + sampledata.SAMPLE_FILES[0].file_name
    return out


def crop_box(seg, margin: int = 22):
    """(y0, y1, x0, x1) around every slice's segmentation, plus a margin."""
    import numpy as np

    ys, xs = np.nonzero(seg.max(axis=0))
    return (
        max(ys.min() - margin, 0),
        min(ys.max() + margin + 1, seg.shape[1]),
        max(xs.min() - margin, 0),
        min(xs.max() + margin + 1, seg.shape[2]),
    )


def grey_window(image):
    import numpy as np

    lo, hi = np.percentile(image, (1, 99.5))
    return float(lo), float(hi)


def draw_slice(
    ax, img, window, seg=None, dis=None, regions=None, classes=(), fill_seg=False, labels=None, dis_window=(0.0, LN2)
):
    """One slice (already cropped): image, then segmentation (filled or outlined), disagreement,
    region outlines with ``labels`` {rank: text}."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    ax.imshow(img, cmap="gray", vmin=window[0], vmax=window[1], interpolation="nearest")
    if seg is not None:
        for value, cls in enumerate(classes):
            if value == 0 or not (seg == value).any():
                continue
            if fill_seg:
                ax.imshow(
                    np.ma.masked_where(seg != value, seg),
                    cmap=ListedColormap([cls["color"]]),
                    alpha=0.5,
                    interpolation="nearest",
                )
            else:
                ax.contour(seg == value, levels=[0.5], colors=[cls["color"]], linewidths=1.4)
    if dis is not None:
        shown = ax.imshow(
            np.ma.masked_less(dis, SHOW_ABOVE),
            cmap="inferno",
            vmin=dis_window[0],
            vmax=dis_window[1],
            alpha=0.85,
            interpolation="nearest",
        )
    else:
        shown = None
    if regions is not None:
        for rank in np.unique(regions[regions > 0]):
            ax.contour(regions == rank, levels=[0.5], colors=[REGION_COLOUR], linewidths=0.9, linestyles="--")
            if labels and rank in labels:
                ys, xs = np.nonzero(regions == rank)
                ax.text(
                    xs.min(),
                    max(ys.min() - 2, 0),
                    labels[rank],
                    color=REGION_COLOUR,
                    fontsize=8,
                    va="bottom",
                    fontweight="bold",
                    clip_on=True,
                    bbox=dict(facecolor="black", alpha=0.6, pad=1, linewidth=0),
                )
    ax.set_xticks([])
    ax.set_yticks([])
    return shown


def save_small(fig, path: Path) -> int:
    """Save ``fig`` as a PNG, reduced to a 256-colour palette when it would exceed
    :data:`MAX_BYTES`; its size in bytes."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, facecolor=fig.get_facecolor())
    picture = Image.open(buf).convert("RGB")
    picture.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        picture.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
            path, optimize=True
        )
    return path.stat().st_size


def render(sample: Path, out_dir: Path, report: dict, classes: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    img, seg = read(sample), read(out_dir / "segmentation.nii.gz")
    dis, regions = read(out_dir / "disagreement.nii.gz"), read(out_dir / "regions.nii.gz")
    y0, y1, x0, x1 = crop_box(seg)
    crop = (slice(None), slice(y0, y1), slice(x0, x1))
    img, seg, dis, regions = img[crop], seg[crop], dis[crop], regions[crop]
    window = grey_window(img)
    p_error = {i + 1: r["p_error"] for i, r in enumerate(report["regions"])}
    labels = {rank: f"#{rank} p={p:.2f}" for rank, p in p_error.items()}
    bundle = report["bundle"]["id"]
    headline = (
        f"CARDSegment, bundle {bundle}, on the synthetic phantom (sample data): agreement "
        f"{report['agreement']:.3f}, {len(report['regions'])} flagged region{'' if len(report['regions']) == 1 else 's'}, "
        f"out of domain: {'yes' if report['out_of_domain'] else 'no'}"
    )
    legend = [Patch(color=c["color"], label=c["name"]) for c in classes[1:]]
    dis_window = overlay_range("disagreement", report)  # the module's own window and legend

    # overview: one slice, four panels
    k = int(np.argmax((regions == 1).sum(axis=(1, 2)))) if (regions == 1).any() else img.shape[0] // 2
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.6), facecolor="white")
    draw_slice(axes[0], img[k], window)
    axes[0].set_title(f"image (slice {k + 1} of {img.shape[0]})")
    draw_slice(axes[1], img[k], window, seg=seg[k], classes=classes, fill_seg=True)
    axes[1].legend(handles=legend, loc="lower left", fontsize=8, framealpha=0.8)
    axes[1].set_title("segmentation")
    shown = draw_slice(axes[2], img[k], window, dis=dis[k], dis_window=dis_window)
    fig.colorbar(shown, ax=axes[2], fraction=0.046, pad=0.02).set_label(
        overlay_title("disagreement", report).replace(" (", "\n("), fontsize=8
    )
    axes[2].set_title("disagreement (hidden below 0.01)")
    draw_slice(axes[3], img[k], window, seg=seg[k], regions=regions[k], classes=classes, labels=labels)
    axes[3].set_title("flagged regions, most likely error first")
    fig.suptitle(headline, fontsize=10)
    fig.tight_layout()
    size = save_small(fig, HERE / OVERVIEW)
    plt.close(fig)
    print(f"wrote {HERE / OVERVIEW} ({size} bytes)")

    # review: every slice, and the region table
    n = img.shape[0]
    cols = 5
    rows = int(math.ceil(n / cols))
    fig = plt.figure(figsize=(16, 2.6 * rows + 0.7), facecolor="white")
    grid = fig.add_gridspec(rows, cols + 2)
    for z in range(n):
        ax = fig.add_subplot(grid[z // cols, z % cols])
        draw_slice(
            ax, img[z], window, seg=seg[z], dis=dis[z], regions=regions[z], classes=classes, dis_window=dis_window
        )
        ax.set_title(f"slice {z + 1}" + (" (base)" if z == 0 else " (apex)" if z == n - 1 else ""), fontsize=9)
    table = fig.add_subplot(grid[:, cols:])
    table.axis("off")
    lines = ["Flagged regions (review first: #1)", ""]
    lines += [
        f"#{i + 1}  p_error {r['p_error']:.2f}  {r['volume_mm3'] / 1000:.1f} ml  slices "
        f"{r['bbox_ijk'][2][0] + 1}-{r['bbox_ijk'][2][1] + 1}"
        for i, r in enumerate(report["regions"])
    ]
    lines += ["", "Class volumes (ml)"]
    lines += [f"{name}: {ml:.1f}" for name, ml in report["class_volumes_ml"].items()]
    lines += [
        "",
        f"agreement {report['agreement']:.3f}",
        f"bundle {bundle}",
        "outlines: segmentation",
        "colour: disagreement",
        "green dashes: flagged regions",
    ]
    table.text(0.0, 1.0, "\n".join(lines), va="top", family="monospace", fontsize=9)
    table.legend(handles=legend, loc="lower left", fontsize=8)
    fig.suptitle(headline, fontsize=10)
    fig.tight_layout()
    size = save_small(fig, HERE / REVIEW)
    plt.close(fig)
    print(f"wrote {HERE / REVIEW} ({size} bytes)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write-sample-data",
        action="store_true",
        help="rewrite the sample data (CARDSegment/Resources/SampleData) first",
    )
    parser.add_argument("--python", default=sys.executable, help="the Python that runs cardseg segment")
    a = parser.parse_args(argv)
    classes = bundle_classes()
    folder = sampledata.sample_folder(MODULE_DIR)
    if a.write_sample_data:
        for name, digest in phantom_sample.write_sample_files(folder, classes).items():
            print(f"{name}: sha256 {digest}  (put it in CARDSegmentLib/install/sampledata.py SAMPLE_FILES)")
    sample = folder / sampledata.SAMPLE_FILES[0].file_name
    if not sample.is_file():
        print(f"make_screenshots: error: {sample}: no sample image (run with --write-sample-data)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cardseg-screenshots-") as tmp:
        out_dir = Path(tmp) / "out"
        report = segment(sample, out_dir, a.python)
        render(sample, out_dir, report, classes)
    (HERE / REPORT).write_text(json.dumps(reduced_report(report), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {HERE / REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

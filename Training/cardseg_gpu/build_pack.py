"""Build the compact data pack that one GPU training run reads (never commit it: it is ACDC).

    python Training/cardseg_gpu/build_pack.py [--data ../shared/data/acdc] [--out Training/cardseg_gpu/pack]
                                      [--spacing 1.4] [--input-size 160] [--wheels DIR]

The pack is a folder (git-ignored) holding:

* ``data.npz``: the training and source-validation slices already on the network grid, exactly
  as :class:`cardseg_train.data.slice_dataset.SliceDataset` (and so inference) maps them, stored
  compactly: images as ``uint8`` (the engine's per-slice ``[0, 1]`` scaling times 255), labels
  as ``uint8``, each slice's case id. Test patients are never read.
* ``pack.json``: the grid, the preprocessing, the classes, the split and a checksum of
  ``data.npz``, copied into the provenance of every network trained on it.
* ``wheels/``: the pure-Python wheels the GPU machine lacks (MONAI), installed there with
  ``pip install --no-index --target``.

Nothing here needs a GPU; :mod:`Training.gpu.run` (``run.py``) is the entry script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
for sub in ("CARDSegment", "Training"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

PACK_FORMAT = "cardseg-gpu-pack"
#: packs above this size cannot travel with the working tree (64 MiB in all)
MAX_PACK_BYTES = 48 * 2**20


def quantize(images) -> np.ndarray:
    """Network-grid images ``(n, 1, N, N)`` in ``[0, 1]`` → ``uint8 (n, N, N)`` (step 1/255)."""
    arr = np.asarray(images, dtype=np.float32)[:, 0]
    return np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class PackOptions:
    """How :func:`build_pack` maps the data onto the network grid and what it adds to the pack.

    spacing: network pixel size in mm; size: network grid side; low, high: the per-slice
    normalisation's percentiles; wheels: a folder that already holds the MONAI wheel (``None``:
    ``pip download`` it); with_wheels: put the wheel in the pack (smoke packs go without);
    max_patients: the first few patients per split only (``None``: all)."""

    spacing: float = 1.4
    size: int = 160
    low: float = 0.5
    high: float = 99.5
    wheels: Optional[str] = None
    with_wheels: bool = True
    max_patients: Optional[int] = None


def split_arrays(data: str, split: str, options: PackOptions, fmt=None) -> dict:
    """One split's slices on the network grid: ``images`` ``uint8 (n, N, N)``, ``labels``, ``cases``
    (one case id per slice) and the split's ``patients``."""
    from cardseg_train.data.datasets import load_split
    from cardseg_train.data.slice_dataset import SliceDataset

    o = options
    recs = load_split(data, split, fmt=fmt, max_patients=o.max_patients)
    ds = SliceDataset(recs, o.spacing, o.size, o.low, o.high, num_classes=4)
    return {
        "images": quantize(ds.images),
        "labels": ds.labels.numpy().astype(np.uint8),
        "cases": np.array(ds.cases),
        "patients": sorted({r.patient for r in recs}),
    }


def fetch_wheels(dest: Path, wheels: str | None) -> list:
    """Copy (or ``pip download``) the MONAI wheel matching the installed version into ``dest``."""
    import monai

    dest.mkdir(parents=True, exist_ok=True)
    name = f"monai-{monai.__version__}-py3-none-any.whl"
    if wheels and (Path(wheels) / name).is_file():
        shutil.copy2(Path(wheels) / name, dest / name)
    elif not (dest / name).is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(dest),
                f"monai=={monai.__version__}",
            ],
            check=True,
        )
    return sorted(p.name for p in dest.glob("*.whl"))


def build_pack(data: str, out: Path, options: PackOptions = PackOptions()) -> dict:
    """Write the pack of ``data`` (a dataset folder or ``synthetic``) into ``out``: ``data.npz``,
    ``pack.json`` and (``options.with_wheels``) ``wheels/``. Returns ``pack.json``'s record plus
    the pack's ``bytes``; a pack over :data:`MAX_PACK_BYTES` is refused (``SystemExit``)."""
    from cardseg_train.data.datasets import detect_format
    from cardseg_train.training.config import data_name

    fmt = detect_format(data)
    out.mkdir(parents=True, exist_ok=True)
    o = options
    parts = {s: split_arrays(data, s, o, fmt) for s in ("train", "val")}
    arrays = {f"{s}_{k}": v[k] for s, v in parts.items() for k in ("images", "labels", "cases")}
    tmp = out / ".data.npz.part"
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)
    tmp.replace(out / "data.npz")
    digest = hashlib.sha256((out / "data.npz").read_bytes()).hexdigest()
    meta = {
        "format": PACK_FORMAT,
        "version": 1,
        "data": data_name(data, fmt),
        "data_format": fmt,
        "pixel_spacing_mm": o.spacing,
        "input_size": o.size,
        "preprocessing": {
            "normalization": "slice-percentile",
            "low_percentile": o.low,
            "high_percentile": o.high,
            "stored_as": "uint8 = round(255 * image)",
        },
        "num_classes": 4,
        "classes": ["background", "RV", "MYO", "LV"],
        "split": {s: v["patients"] for s, v in parts.items()},
        "slices": {s: int(len(v["images"])) for s, v in parts.items()},
        "data_sha256": digest,
        "wheels": fetch_wheels(out / "wheels", o.wheels) if o.with_wheels else [],
    }
    (out / "pack.json").write_text(json.dumps(meta, indent=2) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if total > MAX_PACK_BYTES:
        raise SystemExit(f"build_pack: the pack is {total / 2**20:.1f} MiB, over {MAX_PACK_BYTES / 2**20:.0f} MiB")
    meta["bytes"] = total
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Build the data pack of one GPU training run (git-ignored).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--data",
        default=str(ROOT.parent / "shared" / "data" / "acdc"),
        help="dataset folder, or 'synthetic' for a smoke pack",
    )
    ap.add_argument("--out", default=str(ROOT / "Training" / "cardseg_gpu" / "pack"))
    ap.add_argument("--spacing", type=float, default=1.4, help="network pixel size, mm")
    ap.add_argument("--input-size", type=int, default=160, help="network grid side")
    ap.add_argument("--wheels", help="folder that already holds the MONAI wheel (else pip download)")
    ap.add_argument("--no-wheels", action="store_true", help="smoke packs: the machine already has MONAI")
    ap.add_argument("--max-patients", type=int, help="smoke packs: first few patients per split")
    a = ap.parse_args(argv)
    options = PackOptions(
        spacing=a.spacing,
        size=a.input_size,
        wheels=a.wheels,
        with_wheels=not a.no_wheels,
        max_patients=a.max_patients,
    )
    meta = build_pack(a.data, Path(a.out), options)
    print(
        f"pack {a.out}: {meta['slices']['train']} training and {meta['slices']['val']} validation slices at "
        f"{a.input_size}px x {a.spacing} mm, {meta['bytes'] / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

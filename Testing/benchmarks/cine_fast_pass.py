"""Benchmark: what the fast pass of a cine subject costs on the CPU (not a test).

    python Testing/benchmarks/cine_fast_pass.py [--frames 20] [--bundle PATH] [--backend auto|torch|onnx]
                                                [--threads N] [--out FILE.json]

A 4D NIfTI of ``--frames`` frames of the phantom (``cardseg synth``'s, 8 slices of 192 x 176 at
1.5 mm, its anatomy scaled in-plane per frame so that the LV curve has one beat) goes through
:func:`cardseg.cohort.cine.fast_pass` with the bundle (default: the shipped one) loaded once as
a ``cardseg batch`` worker: every frame read from the 4D file and segmented with the primary
alone. Reported: the pass's wall time per subject and per frame, the share spent reading frames,
and one CARD case of one frame (:func:`cardseg.segment.segment_volume`, nothing written) for
scale: the pass's cost in CARD cases. A first, untimed frame warms the caches (ONNX export,
prepared torch programs). The load average before and after is recorded: other work on a shared
machine only adds time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _cine(path: Path, frames: int) -> Path:
    import SimpleITK as sitk
    from scipy import ndimage

    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, _ = synthetic_cine_volume(shape=(8, 192, 176), spacing=(1.5, 1.5, 8.0), seed=0)
    a = vol.array
    centre = np.array([(a.shape[1] - 1) / 2, (a.shape[2] - 1) / 2])
    images = []
    for k in range(frames):
        m = np.eye(2) / (1.0 - 0.2 * math.sin(math.pi * k / frames))
        planes = [ndimage.affine_transform(p, m, centre - m @ centre, order=1, mode="nearest") for p in a]
        images.append(sitk.GetImageFromArray(np.stack(planes).astype(np.float32)))
    cine = sitk.JoinSeries(images)
    cine.SetSpacing((*vol.spacing, 0.04))
    sitk.WriteImage(cine, str(path))
    return path


def _timed_reads(path: Path, frames: int) -> float:
    from cardseg.io.volume import read_volume

    t0 = time.perf_counter()
    for k in range(frames):
        read_volume(path, k)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--bundle", default=None, help="bundle folder (default: the shipped one)")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "onnx"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cine_fast_pass.json"))
    a = p.parse_args(argv)

    from cardseg import segment
    from cardseg.bundle.folder import check_bundle
    from cardseg.cohort.cine import CineSubject, fast_pass
    from cardseg.cohort.worker import CaseWorker
    from cardseg.io.cine_info import read_cine_info
    from cardseg.io.volume import read_volume

    checked = check_bundle(a.bundle)
    worker = CaseWorker(checked.root, "card", "cpu", 8, a.threads, a.backend)
    worker.load(checked=checked)
    with tempfile.TemporaryDirectory(prefix="cardseg-cine-bench-") as tmp:
        path = _cine(Path(tmp) / "cine.nii.gz", a.frames)
        info = read_cine_info(path)
        sub = CineSubject("bench", str(path), info, "ed-es")
        first = read_volume(path, 0)
        warm = segment.SegmentOptions(method="uc", device=worker.device, batch_size=worker.batch_size)
        segment.segment_volume(first, worker.bundle, warm)  # warms the caches, untimed
        card = segment.SegmentOptions(method="card", device=worker.device, batch_size=worker.batch_size)
        segment.segment_volume(first, worker.bundle, card)
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        curve = fast_pass(sub, worker, checked.config)
        pass_s = time.perf_counter() - t0
        read_s = _timed_reads(path, a.frames)
        t0 = time.perf_counter()
        segment.segment_volume(first, worker.bundle, card)
        card_s = time.perf_counter() - t0
        load_after = os.getloadavg()
    lv = np.asarray(curve.lv)
    result = {
        "what": "cardseg.cohort.cine.fast_pass on a 4D phantom cine (every frame read and segmented with the primary)",
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()},
        "device": str(worker.device),
        "backend": getattr(worker.bundle, "backend", a.backend),
        "threads": a.threads,
        "bundle": checked.config.get("id"),
        "frames": a.frames,
        "frame_shape_zyx": list(first.shape),
        "fast_pass_s_per_subject": pass_s,
        "fast_pass_s_per_frame": pass_s / a.frames,
        "reading_share_of_pass": read_s / pass_s,
        "card_case_s": card_s,
        "fast_pass_in_card_cases": pass_s / card_s,
        "lv_curve_ml": {
            "max": float(lv.max()),
            "min": float(lv.min()),
            "argmax": int(lv.argmax()),
            "argmin": int(lv.argmin()),
        },
        "load_average_before": load_before,
        "load_average_after": load_after,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"fast pass: {pass_s:.1f} s per subject of {a.frames} frames ({pass_s / a.frames:.2f} s/frame, "
        f"{100 * read_s / pass_s:.0f} % reading); one CARD case {card_s:.2f} s; load {load_after[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

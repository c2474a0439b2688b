"""Benchmark: what a whole case costs with CARD against the primary alone, flipped copies included
(not a test).

    python Testing/benchmarks/whole_case.py [--bundle PATH] [--input VOLUME] [--rounds 7]
                                            [--frames 6] [--threads 2] [--backend auto]
                                            [--json OUT.json]

In one process, on the same volume (default: the ``cardseg synth`` phantom, 10 slices of
192 x 176, written to a temporary NIfTI), interleaved rounds of the whole case as
:func:`cardseg.segment.segment_file` runs it (read, preprocess, trajectory, flipped copies,
postprocess, write into a fresh folder) for three modes: ``uc``, ``card`` with the TAC rule the
bundle keeps (its regions cut from the TAC alone: no flipped copy) and the default ``card``; after
one warm-up each. Then the same per frame of a cine: a 4-D NIfTI of ``--frames`` copies of the
volume, each frame a whole case (``FileOptions(frame=k)``), uc against the default card.
Reported: the medians over the rounds of the wall time and of ``timings_s`` (trajectory, flips),
the ratios taken within each round (their median), and the load average before and after.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODES = ("uc", "card without flips", "card")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", help="default: the shipped bundle")
    ap.add_argument("--input", help="volume file (default: the cardseg synth phantom)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--frames", type=int, default=6, help="frames of the cine rounds (0: no cine rounds)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="auto", help="torch, onnx or auto (as cardseg segment)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    return ap


class Runner:
    """Runs one whole case of a mode into a fresh folder under ``tmp``."""

    def __init__(self, bundle, tmp: Path):
        from cardseg.bundle.review_rules import choose_review_map, review_rules

        self.bundle, self.tmp, self.count = bundle, tmp, 0
        self.regions = bundle.config["regions"]
        rules = review_rules(bundle.config)
        if self.regions.get("map") != "tac_flips" or "tac" not in rules:
            raise SystemExit("whole_case: the bundle must cut its regions from TAC + flips and keep a TAC rule")
        self.plain = copy.deepcopy(choose_review_map(bundle.config, "tac")["regions"])

    def __call__(self, mode: str, path: Path, frame=None) -> dict:
        from cardseg.segment import FileOptions, SegmentOptions, segment_file

        self.count += 1
        self.bundle.config["regions"] = self.plain if mode == "card without flips" else self.regions
        t0 = time.perf_counter()
        try:
            report = segment_file(
                path,
                self.tmp / f"out-{self.count}",
                self.bundle,
                SegmentOptions("uc" if mode == "uc" else "card"),
                FileOptions(frame=frame),
            )
        finally:
            self.bundle.config["regions"] = self.regions
        wall = time.perf_counter() - t0
        t = report["timings_s"]
        return {"wall_s": wall, "trajectory_s": t["trajectory"], "flips_s": t.get("flips", 0.0)}


def _rounds(run, modes, count: int, cases) -> list:
    """``count`` interleaved rounds; each round runs every mode on every case (a (path, frame) pair)."""
    for m in modes:
        run(m, *cases[0])  # warm-up: sessions, caches
    out = []
    for r in range(count):
        rd = {}
        for m in modes:
            parts = [run(m, *case) for case in cases]
            rd[m] = {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}
        out.append(rd)
        print(f"round {r + 1}: " + ", ".join(f"{m} {rd[m]['wall_s']:.2f} s" for m in modes), flush=True)
    return out


def summary(rounds: list, modes) -> dict:
    """Medians of each mode's figures and of the per-round ratios to ``uc``."""
    med = {m: {k: statistics.median(rd[m][k] for rd in rounds) for k in rounds[0][m]} for m in modes}
    ratios = {
        f"{m.replace(' ', '_')}_over_uc": statistics.median(rd[m]["wall_s"] / rd["uc"]["wall_s"] for rd in rounds)
        for m in modes[1:]
    }
    return {"median": med, "ratio_median": ratios, "rounds_detail": rounds}


def _volumes(a, tmp: Path):
    """The case's NIfTI and the cine's 4-D NIfTI of ``--frames`` copies of it."""
    import numpy as np
    import SimpleITK as sitk

    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.io.volume import read_volume

    volume = read_volume(a.input) if a.input else synthetic_cine_volume(shape=(10, 192, 176), seed=0)[0]
    case = tmp / "case.nii.gz"
    sitk.WriteImage(volume.to_image(volume.array), str(case))
    if not a.frames:
        return volume, case, None
    frames = [sitk.GetImageFromArray(np.ascontiguousarray(volume.array)) for _ in range(a.frames)]
    for f in frames:
        f.CopyInformation(volume.to_image(volume.array))
    cine = tmp / "cine.nii.gz"
    sitk.WriteImage(sitk.JoinSeries(frames), str(cine))
    return volume, case, cine


def main() -> None:
    a = _parser().parse_args()
    from cardseg.bundle.loading import load_bundle

    bundle = load_bundle(a.bundle, device="cpu", backend=a.backend, threads=a.threads)
    with tempfile.TemporaryDirectory(prefix="cardseg-whole-case-") as tmp:
        tmp = Path(tmp)
        volume, case, cine = _volumes(a, tmp)
        run = Runner(bundle, tmp)
        load_before = os.getloadavg()
        result = {"case": summary(_rounds(run, MODES, a.rounds, [(case, None)]), MODES)}
        if cine is not None:
            frames = [(cine, k) for k in range(a.frames)]
            result["cine_per_frame"] = summary(
                _rounds(run, ("uc", "card"), max(1, a.rounds // 2), frames), ("uc", "card")
            )
        load_after = os.getloadavg()
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
        "bundle": bundle.ident,
        "backend": bundle.backend,
        "threads": a.threads,
        "volume_shape_zyx": list(volume.shape),
        "rounds": a.rounds,
        "cine_frames": a.frames,
        "load_average_before": load_before,
        "load_average_after": load_after,
        **result,
    }
    print(json.dumps({k: v["ratio_median"] for k, v in result.items() if isinstance(v, dict) and "ratio_median" in v}))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

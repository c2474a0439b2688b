"""Benchmark: what the flipped copies of a ``tac_flips`` review map cost a card run (not a test).

    python Testing/benchmarks/flip_cost.py [--bundle PATH] [--input VOLUME] [--rounds 5] [--threads 2]
                                           [--backend auto] [--json OUT.json]

In one process, on the same volume (default: the ``cardseg synth`` phantom, 10 slices of 192 x
176), interleaved rounds of ``segment_volume`` (read and write excluded): ``card`` as the bundle
says (its regions cut from TAC + the flipped runs' disagreement: three more runs of the primary),
``card`` with the TAC rule the bundle keeps (``--review-map tac``: the newest rule of its
``regions.previous`` chain cut from the TAC alone, no flipped copy) and ``uc``; after one warm-up each. Reported per mode: the median over the rounds
of ``timings_s`` (trajectory, flips) and of the computation's wall time, with the ratios taken
within each round, and the load average before and after.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", help="default: the shipped bundle")
    ap.add_argument("--input", help="volume file (default: the cardseg synth phantom)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--backend", default="auto", help="torch, onnx or auto (as cardseg segment: ONNX Runtime when installed)"
    )
    ap.add_argument("--json", help="also write the figures to this JSON file")
    a = ap.parse_args()

    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.bundle.review_rules import choose_review_map, review_rules
    from cardseg.io.volume import read_volume
    from cardseg.segment import SegmentOptions, segment_volume

    import torch

    torch.set_num_threads(a.threads)
    bundle = load_bundle(a.bundle, device="cpu", backend=a.backend, threads=a.threads)
    regions = bundle.config["regions"]
    rules = review_rules(bundle.config)  # the rule --review-map tac runs: the newest TAC rule of the chain
    if regions.get("map") != "tac_flips" or "tac" not in rules:
        raise SystemExit(
            "flip_cost: the bundle must cut its regions from TAC + flips and keep a TAC rule among "
            "its earlier ones (regions.previous...)"
        )
    plain = copy.deepcopy(choose_review_map(bundle.config, "tac")["regions"])
    volume = read_volume(a.input) if a.input else synthetic_cine_volume(shape=(10, 192, 176), seed=0)[0]

    def run(mode: str) -> dict:
        bundle.config["regions"] = plain if mode == "card, TAC rule" else regions
        t0 = time.perf_counter()
        res = segment_volume(volume, bundle, SegmentOptions("uc" if mode == "uc" else "card"))
        wall = time.perf_counter() - t0
        bundle.config["regions"] = regions
        t = res.report["timings_s"]
        return {
            "wall_s": wall,
            "trajectory_s": t["trajectory"],
            "flips_s": t.get("flips", 0.0),
            "regions": len(res.report["regions"]),
        }

    modes = ("card, TAC + flips", "card, TAC rule", "uc")
    for m in modes:
        run(m)  # warm-up: sessions, caches
    load_before = os.getloadavg()
    rounds = []
    for r in range(a.rounds):
        rounds.append({m: run(m) for m in modes})
        print(f"round {r + 1}: " + ", ".join(f"{m} {rounds[-1][m]['wall_s']:.2f} s" for m in modes), flush=True)
    load_after = os.getloadavg()

    def med(m, k):
        return statistics.median(rd[m][k] for rd in rounds)

    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
        "bundle": bundle.ident,
        "backend": bundle.backend,
        "threads": a.threads,
        "volume_shape_zyx": list(volume.shape),
        "rounds": a.rounds,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "median": {m: {k: med(m, k) for k in ("wall_s", "trajectory_s", "flips_s")} for m in modes},
        "ratio_median": {
            "card_flips_over_card_tac_rule": statistics.median(
                rd["card, TAC + flips"]["wall_s"] / rd["card, TAC rule"]["wall_s"] for rd in rounds
            ),
            "flips_over_trajectory": statistics.median(
                rd["card, TAC + flips"]["flips_s"] / rd["card, TAC + flips"]["trajectory_s"] for rd in rounds
            ),
            "card_flips_over_uc": statistics.median(
                rd["card, TAC + flips"]["wall_s"] / rd["uc"]["wall_s"] for rd in rounds
            ),
        },
        "rounds_detail": rounds,
    }
    print(json.dumps({k: result[k] for k in ("median", "ratio_median")}, indent=1))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

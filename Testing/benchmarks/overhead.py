"""Benchmark: CARD's overhead over the primary alone on one volume (not a test).

    python Testing/benchmarks/overhead.py [--bundle PATH] [--input VOLUME] [--repeats 3] [--backend torch|onnx]
    python Testing/benchmarks/overhead.py --paper-scale      # on a GPU: the paper's batch of 32 at 256 x 256

Runs ``segment_volume`` with ``--method uc`` and ``--method card`` on the same volume in one
process (after one warm-up each), and prints the median wall time of each, the overhead ratio
card/uc, slices per second, and the floor the reference's own compute sets (one primary and
one reference forward pass timed separately). Without --bundle it uses the shipped bundle, or
builds an untrained one of the given sizes (speed does not depend on training).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle")
    ap.add_argument("--input", help="volume file (default: a synthetic 10-slice cine-like volume)")
    ap.add_argument("--primary", default="time-swinunetr:small", help="for an untrained bundle")
    ap.add_argument("--reference", default="time-swinunetr:mini", help="for an untrained bundle")
    ap.add_argument("--input-size", type=int, default=128)
    ap.add_argument("--spacing", type=float, default=1.5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--backend", default="torch", choices=["torch", "onnx"], help="onnx: needs the [speed] extra")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--paper-scale", action="store_true",
                    help="the paper's timing instead: time-SwinUNETR base (40.5M) primary alone vs with a Mini "
                         "reference, 5 steps on a batch of 32 slices of 256 x 256, random weights (the GPU run's "
                         "engine check, Training/gpu/run.py)")
    a = ap.parse_args()
    if a.paper_scale:
        import json
        import sys
        from pathlib import Path

        training = str(Path(__file__).resolve().parents[2] / "Training")
        if training not in sys.path:
            sys.path.insert(0, training)
        from gpu.checks import paper_scale_timing

        if a.threads:
            torch.set_num_threads(a.threads)
        print(json.dumps(paper_scale_timing(smoke=not torch.cuda.is_available(), repeats=a.repeats), indent=2))
        return

    from cardseg.bundle.folder import BUNDLES_DIR, DEFAULT_NAME
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.scaffold import init_bundle, synthetic_cine_volume
    from cardseg.io.volume import read_volume
    from cardseg.method.networks import count_parameters
    from cardseg.segment import network_inputs, resolve_device, segment_volume

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    tmp = tempfile.TemporaryDirectory()
    path = a.bundle
    if path is None and (BUNDLES_DIR / DEFAULT_NAME / "bundle.json").is_file():
        path = BUNDLES_DIR / DEFAULT_NAME
    if path is None:
        path = init_bundle(f"{tmp.name}/b", a.primary, a.reference, a.input_size, a.spacing)
    bundle = load_bundle(path, device=device, backend=a.backend)
    volume = read_volume(a.input) if a.input else synthetic_cine_volume((10, 216, 256))[0]
    z = volume.shape[0]

    def timed(method: str) -> tuple:
        """``(wall of segment_volume, its trajectory time)``"""
        t0 = time.perf_counter()
        result = segment_volume(volume, bundle, method=method, device=device, batch_size=a.batch_size)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, result.report["timings_s"]["trajectory"]

    times, trajectory = {}, {}
    for method in ("uc", "card"):
        timed(method)  # warm-up
        runs = [timed(method) for _ in range(a.repeats)]
        times[method] = statistics.median(r[0] for r in runs)
        trajectory[method] = statistics.median(r[1] for r in runs)

    x, _ = network_inputs(volume, bundle)
    xb = x[: a.batch_size].to(device)
    state = torch.full((xb.shape[0], bundle.num_classes, *xb.shape[2:]), 1.0 / bundle.num_classes, device=device)
    t = torch.full((xb.shape[0],), 49, dtype=torch.long, device=device)

    def forward_time(net) -> float:
        with torch.no_grad():
            net(xb, state, t)
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                net(xb, state, t)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    tp, tr = forward_time(bundle.primary), forward_time(bundle.reference)
    def params(role: str) -> int:
        net = getattr(bundle, role)
        if isinstance(net, torch.nn.Module):
            return count_parameters(net)
        return bundle.config["networks"][role]["parameters"]

    print(f"bundle {bundle.ident}: primary {params('primary'):,d} params, "
          f"reference {params('reference'):,d} params, grid {bundle.config['input_size']}px")
    print(f"device {device}, backend {bundle.backend}, threads {torch.get_num_threads()}, volume {z} slices, "
          f"batch {a.batch_size}, "
          f"{len(bundle.sampled_steps)} steps")
    print(f"uc   {times['uc']:.3f} s  ({z / times['uc']:.2f} slices/s)")
    print(f"card {times['card']:.3f} s  ({z / times['card']:.2f} slices/s)")
    print(f"overhead card/uc: {times['card'] / times['uc']:.3f}x  "
          f"(reference compute floor 1 + t_ref/t_primary = {1 + tr / tp:.3f}x; paper: 1.16x on a GPU)")
    print(f"trajectory card/uc: {trajectory['card'] / trajectory['uc']:.3f}x "
          f"(uc {trajectory['uc']:.3f} s, card {trajectory['card']:.3f} s)")
    if a.json:
        import json
        import os
        import platform

        figures = {"bundle": bundle.ident, "device": str(device), "backend": bundle.backend,
                   "threads": torch.get_num_threads(), "slices": z, "batch_size": a.batch_size, "repeats": a.repeats,
                   "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                               "load_average_at_end": os.getloadavg()},
                   "segment_volume_s": times, "trajectory_s": trajectory,
                   "forward_s": {"primary": tp, "reference": tr},
                   "card_over_uc_segment_volume": times["card"] / times["uc"],
                   "card_over_uc_trajectory": trajectory["card"] / trajectory["uc"],
                   "floor": 1 + tr / tp,
                   "goal": "card/uc trajectory within 0.05 of the floor measured in the same run"}
        with open(a.json, "w") as f:
            f.write(json.dumps(figures, indent=2) + "\n")
    tmp.cleanup()


if __name__ == "__main__":
    main()

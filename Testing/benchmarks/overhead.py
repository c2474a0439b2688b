"""Benchmark: CARD's overhead over the primary alone on one volume (not a test).

    python Testing/benchmarks/overhead.py [--bundle PATH] [--input VOLUME] [--rounds 7] [--backend torch|onnx]
                                          [--threads N] [--json OUT.json]
    python Testing/benchmarks/overhead.py --paper-scale      # on a GPU: the paper's batch of 32 at 256 x 256

Runs ``segment_volume`` with ``--method uc`` and ``--method card`` on the same volume in one
process, after one warm-up each, in interleaved rounds (uc, card, card with the reference run
after the primary instead of beside it where the backend overlaps them, then each network's
forward passes alone), so that a change in a shared machine's load hits every figure of a round
alike. Each ratio is taken within its round, and the median over the rounds is reported with
the load average before and after.

The *floor* is ``1 + t_reference / t_primary``: one forward pass of each network on every batch
the trajectory runs (the volume's slices in ``--batch-size`` batches, uniform state, ``t = 49``),
timed alone in the same round; ``floor_batch8`` is the earlier definition (the first batch only).
The goal: card/uc trajectory time within 0.05 of the floor. On a CUDA device the engine replays each
batch's trajectory as a CUDA graph, so the floor is taken from each network's forward pass replayed
as a graph too (the eager floor is kept as ``floor_eager_forwards``), and the graphed outputs are
compared with eager ones (``graphed_vs_eager``); ``CARDSEG_CUDA_GRAPHS=0`` measures eager execution.
Without --bundle it uses the shipped
bundle, or builds an untrained one of the given sizes (speed does not depend on training).
"""

from __future__ import annotations

import argparse
import os
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
    ap.add_argument(
        "--rounds",
        "--repeats",
        dest="repeats",
        type=int,
        default=7,
        help="interleaved rounds (each: uc, card, [card not overlapped], forwards alone)",
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--backend", default="torch", choices=["torch", "onnx"], help="onnx: needs the [speed] extra")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument(
        "--paper-scale",
        action="store_true",
        help="the paper's timing instead: time-SwinUNETR base (40.5M) primary alone vs with a Mini "
        "reference, 5 steps on a batch of 32 slices of 256 x 256, random weights (the GPU run's "
        "engine check, Training/cardseg_gpu/run.py)",
    )
    a = ap.parse_args()
    if a.paper_scale:
        import json
        import sys
        from pathlib import Path

        training = str(Path(__file__).resolve().parents[2] / "Training")
        if training not in sys.path:
            sys.path.insert(0, training)
        from cardseg_gpu.checks import paper_scale_timing

        if a.threads:
            torch.set_num_threads(a.threads)
        print(json.dumps(paper_scale_timing(smoke=not torch.cuda.is_available(), repeats=a.repeats), indent=2))
        return

    from cardseg.bundle.folder import BUNDLES_DIR, DEFAULT_NAME
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.bundle.scaffold import InitOptions, init_bundle
    from cardseg.io.volume import read_volume
    from cardseg.method.networks import count_parameters
    from cardseg.base.devices import resolve_device
    from cardseg.segment import SegmentOptions, network_inputs, segment_volume

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    tmp = tempfile.TemporaryDirectory()
    path = a.bundle
    if path is None and (BUNDLES_DIR / DEFAULT_NAME / "bundle.json").is_file():
        path = BUNDLES_DIR / DEFAULT_NAME
    if path is None:
        options = InitOptions(a.primary, a.reference, a.input_size, a.spacing)
        path = init_bundle(f"{tmp.name}/b", options)
    bundle = load_bundle(path, device=device, backend=a.backend)
    volume = read_volume(a.input) if a.input else synthetic_cine_volume((10, 216, 256))[0]
    z = volume.shape[0]

    x, _ = network_inputs(volume, bundle)
    batches = [x[i : i + a.batch_size].to(device) for i in range(0, z, a.batch_size)]
    overlaps = bool(getattr(bundle.reference, "overlap_safe", False)) and device.type == "cpu"

    def timed(method: str, overlap: bool = True) -> float:
        """``segment_volume``'s trajectory time (includes the resampling to the network grid and back)."""
        if overlaps:
            bundle.reference.overlap_safe = overlap  # the session's switch (set again below)
        result = segment_volume(volume, bundle, SegmentOptions(method=method, device=device, batch_size=a.batch_size))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return result.report["timings_s"]["trajectory"]

    def forwards(net) -> list:
        """One forward pass per batch of the volume, each timed alone: ``[seconds]``."""
        out = []
        with torch.no_grad():
            for xb in batches:
                state = torch.full(
                    (xb.shape[0], bundle.num_classes, *xb.shape[2:]), 1.0 / bundle.num_classes, device=device
                )
                t = torch.full((xb.shape[0],), 49, dtype=torch.long, device=device)
                t0 = time.perf_counter()
                net(xb, state, t)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                out.append(time.perf_counter() - t0)
        return out

    # on a GPU the engine replays each batch's trajectory as a CUDA graph (cardseg.bundle.cuda_graphs.run_graphed,
    # batches padded to --batch-size): its floor is each network's forward pass replayed as a graph too
    from cardseg.bundle.cuda_graphs import cuda_graphs_enabled

    graph_floor = device.type == "cuda" and cuda_graphs_enabled()
    captured = {}

    def forwards_graphed(role: str, net) -> list:
        """One graph replay of ``net``'s forward pass per batch (padded as the engine pads), each timed alone."""
        out = []
        for i, xb in enumerate(batches):
            if (role, i) not in captured:
                xin = xb.new_zeros((a.batch_size,) + tuple(xb.shape[1:]))
                xin[: xb.shape[0]] = xb
                state = torch.full(
                    (a.batch_size, bundle.num_classes, *xb.shape[2:]), 1.0 / bundle.num_classes, device=device
                )
                t = torch.full((a.batch_size,), 49, dtype=torch.long, device=device)
                side = torch.cuda.Stream(device=device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side), torch.no_grad():
                    for _ in range(3):
                        net(xin, state, t)
                torch.cuda.current_stream(device).wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.no_grad(), torch.cuda.graph(g):
                    net(xin, state, t)
                captured[(role, i)] = (g, xin, state, t)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            captured[(role, i)][0].replay()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return out

    def replays(method: str) -> float:
        """Seconds of the engine's graphed trajectory on every batch (``run_graphed``), synchronised."""
        from cardseg.bundle.cuda_graphs import TrajectorySpec, run_graphed

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for xb in batches:
            run_graphed(
                bundle.primary,
                bundle.reference,
                xb,
                TrajectorySpec(
                    bundle.sampled_steps,
                    bundle.num_classes,
                    method,
                    bundle.schedule,
                    bundle.tac_steps if method == "card" else None,
                ),
                batch_size=a.batch_size,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def agreement_with_eager() -> dict:
        """The engine's graphed outputs against its eager ones on this volume (labels, probabilities, TAC)."""
        import numpy as np

        res = {}
        for method in ("card", "uc"):
            graphed = segment_volume(
                volume, bundle, SegmentOptions(method=method, device=device, batch_size=a.batch_size)
            )
            os.environ["CARDSEG_CUDA_GRAPHS"] = "0"
            try:
                eager = segment_volume(
                    volume, bundle, SegmentOptions(method=method, device=device, batch_size=a.batch_size)
                )
            finally:
                os.environ["CARDSEG_CUDA_GRAPHS"] = "1"
            row = {
                "labels_equal_fraction": float(np.mean(np.asarray(graphed.labels) == np.asarray(eager.labels))),
                "max_abs_probability_diff": float(
                    np.abs(np.asarray(graphed.probabilities) - np.asarray(eager.probabilities)).max()
                ),
            }
            if method == "card":
                row["max_abs_tac_diff"] = float(
                    np.abs(np.asarray(graphed.disagreement) - np.asarray(eager.disagreement)).max()
                )
            res[method] = row
        return res

    kinds = ["uc", "card"] + (["card_sequential"] if overlaps else [])
    load_before = os.getloadavg()
    for k in kinds:  # warm-up, twice: on a GPU a grid's graph is captured at its second volume
        for _ in range(2):
            timed("card" if k != "uc" else "uc", overlap=k != "card_sequential")
    forwards(bundle.primary), forwards(bundle.reference)
    if graph_floor:
        forwards_graphed("primary", bundle.primary), forwards_graphed("reference", bundle.reference)
    rounds = []
    for r in range(a.repeats):
        row = {k: timed("card" if k != "uc" else "uc", overlap=k != "card_sequential") for k in kinds}
        fp, fr = forwards(bundle.primary), forwards(bundle.reference)
        row.update(
            {
                "primary_forwards": fp,
                "reference_forwards": fr,
                "floor": 1 + sum(fr) / sum(fp),
                "floor_batch8": 1 + fr[0] / fp[0],
                "load_average": os.getloadavg()[0],
            }
        )
        if graph_floor:  # the engine runs graphs here: so is its floor (the eager one stays beside it)
            gp, gr = forwards_graphed("primary", bundle.primary), forwards_graphed("reference", bundle.reference)
            row.update(
                {
                    "primary_forwards_graphed": gp,
                    "reference_forwards_graphed": gr,
                    "floor_eager_forwards": row["floor"],
                    "floor": 1 + sum(gr) / sum(gp),
                }
            )
            # the graphs' replays alone (every batch of the volume), without the resampling and copies around them
            try:
                for m in ("uc", "card"):
                    row[f"replay_{m}"] = replays(m)
                row["replay_card_over_uc"] = row["replay_card"] / row["replay_uc"]
            except Exception as e:  # noqa: BLE001 - a diagnostic: the round's other figures stand
                row["replay_error"] = f"{type(e).__name__}: {e}"
        for k in kinds[1:]:
            row[f"{k}_over_uc"] = row[k] / row["uc"]
        rounds.append(row)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{k} {row[k]:.3f} s" for k in kinds)
            + f"; card/uc {row['card_over_uc']:.3f}, floor {row['floor']:.3f} (load {row['load_average']:.2f})",
            flush=True,
        )
    if overlaps:
        bundle.reference.overlap_safe = True  # as the session was made (overlaps is True only then)
    load_after = os.getloadavg()
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if isinstance(rounds[0][k], (int, float))}

    def params(role: str) -> int:
        net = getattr(bundle, role)
        if isinstance(net, torch.nn.Module):
            return count_parameters(net)
        return bundle.config["networks"][role]["parameters"]

    print(
        f"bundle {bundle.ident}: primary {params('primary'):,d} params, "
        f"reference {params('reference'):,d} params, grid {bundle.config['input_size']}px"
    )
    print(
        f"device {device}, backend {bundle.backend}, threads {torch.get_num_threads()}, volume {z} slices, "
        f"batch {a.batch_size}, {len(bundle.sampled_steps)} steps, {a.repeats} rounds, load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(f"trajectory uc {med['uc']:.3f} s, card {med['card']:.3f} s (medians)")
    print(
        f"card/uc trajectory: {med['card_over_uc']:.3f}x, floor 1 + t_ref/t_primary {med['floor']:.3f}x "
        f"(batch 8 alone {med['floor_batch8']:.3f}x): {med['card_over_uc'] - med['floor']:+.3f} "
        f"(goal: within 0.05; medians of the per-round figures)"
    )
    if overlaps:
        print(f"card with the reference after the primary (not overlapped): {med['card_sequential_over_uc']:.3f}x")
    agreement = agreement_with_eager() if graph_floor else None
    if agreement:
        print(f"CUDA graphs against eager execution: {agreement}")
    if a.json:
        import json
        import platform

        figures = {
            "bundle": bundle.ident,
            "device": str(device),
            "backend": bundle.backend,
            "threads": torch.get_num_threads(),
            "slices": z,
            "batch_size": a.batch_size,
            "rounds": a.repeats,
            "overlapped_reference": overlaps,
            "cuda_graphs": graph_floor,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "graphed_vs_eager": agreement,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "load_average_before": load_before,
                "load_average_after": load_after,
            },
            "rounds_measured": rounds,
            "medians": med,
            "trajectory_s": {"uc": med["uc"], "card": med["card"]},
            "card_over_uc_trajectory": med["card_over_uc"],
            "floor": med["floor"],
            "over_floor": med["card_over_uc"] - med["floor"],
            "goal": "card/uc trajectory within 0.05 of the floor measured in the same run",
            "goal_met": med["card_over_uc"] <= med["floor"] + 0.05,
        }
        with open(a.json, "w") as f:
            f.write(json.dumps(figures, indent=2) + "\n")
    tmp.cleanup()


if __name__ == "__main__":
    main()

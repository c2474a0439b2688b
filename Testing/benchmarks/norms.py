"""Benchmark: instance norm against the equivalent group norm on the CPU (not a test).

    python Testing/benchmarks/norms.py [--threads 2] [--repeats 10] [--bundle PATH]

Times PyTorch's ``InstanceNorm2d`` and ``GroupNorm(C, C)`` kernels on the activation shapes the
shipped networks see (10 slices at 160 x 160 and their downsampled stages), then the shipped
bundle's two networks, five reverse steps on 10 slices, with the instance norms as built and after
:func:`cardseg.method.networks.fast.instance_to_group_norm`, and the largest logit difference between
the two. Least time of ``--repeats`` runs (other load only ever adds time).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn


def least(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--bundle", help="bundle folder (default: the shipped one)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.no_grad():
        for c, side in [(24, 160), (48, 80), (96, 40), (16, 80), (64, 20)]:
            x = torch.randn(10, c, side, side)
            inst, group = nn.InstanceNorm2d(c), nn.GroupNorm(c, c, affine=False)
            ti, tg = least(lambda: inst(x), a.repeats), least(lambda: group(x), a.repeats)
            print(
                f"(10, {c:3d}, {side:3d}, {side:3d})  instance {1e3 * ti:7.2f} ms  group {1e3 * tg:7.2f} ms  "
                f"{ti / tg:4.1f}x"
            )

        from cardseg.bundle.folder import read_config, resolve_bundle_path
        from cardseg.bundle.loading import load_network
        from cardseg.bundle.weights import verify_weights
        from cardseg.method.diffusion import CategoricalSchedule
        from cardseg.method.networks.fast import instance_to_group_norm
        from cardseg.method.trajectory import run_trajectory

        root = resolve_bundle_path(a.bundle)
        config = read_config(root)
        weights = verify_weights(root, config)
        nets = {role: load_network(root, config, role, weights[role]) for role in ("primary", "reference")}
        fast = {role: copy.deepcopy(net) for role, net in nets.items()}
        for net in fast.values():
            instance_to_group_norm(net)
        n = config["input_size"]
        k = len(config["classes"])
        image = torch.rand(10, 1, n, n)
        steps = config["diffusion"]["sampled_steps"]
        sched = CategoricalSchedule(config["diffusion"]["num_steps"])
        for label, pair in (("instance norm (as built)", nets), ("group norm (engine)", fast)):

            def run():
                return run_trajectory(
                    pair["primary"],
                    image,
                    steps,
                    k,
                    reference=pair["reference"],  # noqa: E731
                    mode="card",
                    schedule=sched,
                )

            print(f"card trajectory, 10 slices, {label}: {least(run, max(1, a.repeats // 5)):.2f} s")
        r1 = run_trajectory(nets["primary"], image, steps, k, reference=nets["reference"], mode="card", schedule=sched)
        r2 = run_trajectory(fast["primary"], image, steps, k, reference=fast["reference"], mode="card", schedule=sched)
        print(
            f"largest logit difference {float((r1.logits - r2.logits).abs().max()):.2e}, "
            f"TAC {float((r1.tac - r2.tac).abs().max()):.2e}"
        )


if __name__ == "__main__":
    main()

"""The engine checks of a GPU run, written to ``OUT/engine.json`` before any training starts.

The shipped bundle's trajectory on CPU vs CUDA (:func:`cuda_consistency`), and the overhead of
CARD over the primary alone under every execution schedule, at paper scale
(:func:`paper_scale_timing`) and on the shipped bundle (:func:`bundle_timing`).
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Sequence

import torch

from cardseg_gpu.engine_env import no_simpleitk


def cuda_consistency(smoke: bool) -> dict:
    """The shipped bundle's CARD trajectory on a phantom: CPU vs CUDA labels, CUDA twice.

    Three CUDA runs of the same volume: the first runs eagerly (a grid's CUDA graph is captured
    once it serves a second volume, :func:`cardseg.bundle.cuda_graphs.run_graphed`), the second
    captures and replays, the third replays; CPU vs CUDA compares the first (a one-shot run's
    path), "CUDA twice" the two graphed runs, and eager vs graphed is reported beside them."""
    no_simpleitk()
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import SegmentOptions, normalized_slices, trajectory_on_slices

    vol, _ = synthetic_cine_volume((10, 216, 256), seed=3)
    cpu_b = load_bundle(device="cpu")
    slices = normalized_slices(vol, cpu_b)
    ref = trajectory_on_slices(
        slices, vol.spacing[:2], cpu_b, SegmentOptions(method="card", device="cpu", batch_size=10)
    )
    res = {"bundle": cpu_b.ident, "slices": int(slices.shape[0])}
    if smoke or not torch.cuda.is_available():
        res["cuda"] = "not available"
        return res
    gpu_b = load_bundle(device="cuda")
    eager, *runs = [
        trajectory_on_slices(
            slices, vol.spacing[:2], gpu_b, SegmentOptions(method="card", device="cuda", batch_size=10)
        )
        for _ in range(3)
    ]
    lab_cpu = ref.logits.argmax(1)
    lab_gpu = [eager.logits.argmax(1)]
    res.update(
        {
            "labels_cpu_vs_cuda_equal_fraction": float((lab_cpu == lab_gpu[0]).float().mean()),
            "labels_cpu_vs_cuda_differ_pixels": int((lab_cpu != lab_gpu[0]).sum()),
            "max_abs_logit_diff_cpu_vs_cuda": float((ref.logits - eager.logits).abs().max()),
            "max_abs_tac_diff_cpu_vs_cuda": float((ref.tac - eager.tac).abs().max()),
            "labels_eager_vs_graphed_differ_pixels": int((eager.logits.argmax(1) != runs[0].logits.argmax(1)).sum()),
            "max_abs_tac_diff_eager_vs_graphed": float((eager.tac - runs[0].tac).abs().max()),
            "cuda_runs_bit_identical_logits": bool(torch.equal(runs[0].logits, runs[1].logits)),
            "cuda_runs_bit_identical_tac": bool(torch.equal(runs[0].tac, runs[1].tac)),
            "cuda_runs_max_abs_logit_diff": float((runs[0].logits - runs[1].logits).abs().max()),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        }
    )
    return res


def timed(fn, cuda: bool, repeats: int) -> List[float]:
    """Two warm-up calls, then ``repeats`` timed calls (seconds, sorted)."""

    def once() -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()
    once()
    return sorted(once() for _ in range(repeats))


class TimingCase(NamedTuple):
    """What :func:`schedule_variants` times: the two networks on one input ``x`` ``(B, 1, H, W)``,
    the sampled ``steps``, the ``k`` classes and the diffusion schedule ``sched``."""

    primary: torch.nn.Module
    reference: torch.nn.Module
    x: torch.Tensor
    steps: Sequence[int]
    k: int
    sched: object

    def spec(self, mode: str):
        from cardseg.bundle.cuda_graphs import TrajectorySpec

        return TrajectorySpec(self.steps, self.k, mode, self.sched)


#: the trajectories timed under every schedule: ``(label, mode, reference on a second stream)``
TRAJECTORIES = (("uc", "uc", False), ("card", "card", False), ("card_streams", "card", True))


def step_inputs(case: TimingCase) -> List[tuple]:
    """The reference's inputs at each sampled step: ``(uniform state (B, K, H, W), t (B,))``."""
    from cardseg.method.diffusion import uniform_state

    x = case.x
    b, _, h, w = x.shape
    states = [uniform_state((b, h, w), case.k, device=x.device) for _ in case.steps]
    t_batches = [torch.full((b,), t, dtype=torch.long, device=x.device) for t in case.steps]
    return list(zip(states, t_batches))


def reference_forwards(case: TimingCase, inputs: List[tuple], dtype) -> Callable[[], None]:
    """The reference's own forwards of one trajectory (one per sampled step, on the
    :func:`step_inputs`), under the family's autocast (``dtype`` ``None``: float32)."""
    x, cuda = case.x, case.x.device.type == "cuda"

    def ref_only():
        with (
            torch.no_grad(),
            torch.autocast("cuda", dtype=dtype) if dtype is not None and cuda else torch.autocast("cpu", enabled=False),
        ):
            for s, tb in inputs:
                case.reference(x, s, tb)

    return ref_only


def graphed_runners(case: TimingCase, dtype, ref_only: Callable[[], None]) -> Dict[str, Callable]:
    """The CUDA-graph family: each trajectory of :data:`TRAJECTORIES` and the reference's forwards
    captured once, each runner replaying its graph."""
    from cardseg.bundle.cuda_graphs import GraphedTrajectory

    runners = {}
    for label, mode, streams in TRAJECTORIES:
        g = GraphedTrajectory(case.primary, case.reference, case.x, case.spec(mode), streams=streams, dtype=dtype)
        runners[label] = lambda g=g: g(case.x)
    ref_graph = torch.cuda.CUDAGraph()
    ref_only()
    with torch.cuda.graph(ref_graph):
        ref_only()
    runners["reference"] = ref_graph.replay
    return runners


def eager_runners(case: TimingCase, dtype, ref_only: Callable[[], None]) -> Dict[str, Callable]:
    """The eager family: each trajectory of :data:`TRAJECTORIES` run as it is called."""
    from cardseg.bundle.cuda_graphs import run_trajectory_fast

    runners = {}
    for label, mode, streams in TRAJECTORIES:
        runners[label] = lambda mode=mode, streams=streams: run_trajectory_fast(
            case.primary, case.reference, case.x, case.spec(mode), streams=streams, dtype=dtype
        )
    runners["reference"] = ref_only
    return runners


def time_family(fam: dict, runners: Dict[str, Callable], ref_eager, cuda: bool, repeats: int) -> None:
    """Fill ``fam`` with one family's timings (median and all runs, ms), its ratios and floor, and
    CARD's agreement with the eager fp32 trajectory ``ref_eager``."""
    ms = lambda ts: round(1000 * ts[len(ts) // 2], 2)  # noqa: E731 - median in ms
    for label, fn in runners.items():
        ts = timed(fn, cuda, repeats)
        fam[f"{label}_ms"] = ms(ts)
        fam[f"{label}_ms_all"] = [round(1000 * t, 2) for t in ts]
    fam["ratio"] = round(fam["card_ms"] / fam["uc_ms"], 3)
    fam["ratio_streams"] = round(fam["card_streams_ms"] / fam["uc_ms"], 3)
    fam["floor"] = round(1 + fam["reference_ms"] / fam["uc_ms"], 3)
    for label in ("card", "card_streams"):
        res = runners[label]()
        agree = (res.logits.argmax(1) == ref_eager.logits.argmax(1)).float().mean()
        fam[f"{label}_label_agreement_vs_eager_fp32"] = float(agree)
        fam[f"{label}_max_abs_tac_diff_vs_eager_fp32"] = float((res.tac - ref_eager.tac).abs().max())


def schedule_variants(primary, reference, x: torch.Tensor, steps, k: int, sched, repeats: int) -> dict:
    """The trajectory under every execution schedule of :mod:`cardseg.bundle.cuda_graphs`, timed in one run.

    For each family (eager fp32, eager bf16, CUDA graph fp32, CUDA graph bf16): ``uc_ms``,
    ``card_ms``, ``card_streams_ms`` (reference on a second stream), the reference's own five
    forwards ``reference_ms``, the ratios, the *floor* ``1 + reference_ms / uc_ms`` and, against
    the eager fp32 CARD trajectory, the label agreement and the largest TAC difference. Each
    family is guarded: one that fails (e.g. capture unsupported) records its error beside what
    it had measured.
    """
    from cardseg.bundle.cuda_graphs import run_trajectory_fast

    case = TimingCase(primary, reference, x, steps, k, sched)
    cuda = x.device.type == "cuda"
    inputs = step_inputs(case)
    with torch.no_grad():
        ref_eager = run_trajectory_fast(primary, reference, x, case.spec("card"))
    out: dict = {}
    families = [("eager_fp32", False, None), ("eager_bf16", False, torch.bfloat16)]
    if cuda:
        families += [("graph_fp32", True, None), ("graph_bf16", True, torch.bfloat16)]
    for name, graph, dtype in families:
        fam: dict = {}
        try:
            ref_only = reference_forwards(case, inputs, dtype)
            runners = (graphed_runners if graph else eager_runners)(case, dtype, ref_only)
            time_family(fam, runners, ref_eager, cuda, repeats)
        except Exception as exc:  # noqa: BLE001 - one schedule failing must not hide the others
            fam["error"] = f"{type(exc).__name__}: {exc}"
            fam["traceback"] = traceback.format_exc()[-1500:]
        out[name] = fam
    return out


def paper_scale_timing(smoke: bool, repeats: int = 5) -> dict:
    """Paper Sec. "Computational overhead": the primary alone vs primary + reference (CARD) over
    5 sampled steps on a batch of 32 slices of 256 x 256, random weights, median of runs, under
    every execution schedule (:func:`schedule_variants`). ``uc_ms``/``card_ms``/``ratio`` are the
    eager fp32 figures (the paper's setting)."""
    from cardseg.method.diffusion import CategoricalSchedule, default_sampling_steps
    from cardseg.method.networks import build_network, count_parameters

    cuda = torch.cuda.is_available() and not smoke
    dev = torch.device("cuda" if cuda else "cpu")
    size, batch, p_size = (256, 32, "base") if not smoke else (64, 2, "mini")
    torch.manual_seed(0)
    primary = build_network({"arch": "time-swinunetr", "size": p_size, "num_classes": 4}).to(dev).eval()
    reference = build_network({"arch": "time-swinunetr", "size": "mini", "num_classes": 4}).to(dev).eval()
    x = torch.rand(batch, 1, size, size, device=dev)
    steps = default_sampling_steps(50, 5)
    out = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "primary_parameters": count_parameters(primary),
        "reference_parameters": count_parameters(reference),
        "input": [batch, 1, size, size],
        "steps": steps,
        "dtype": "float32",
        "repeats": repeats,
    }
    out["schedules"] = schedule_variants(primary, reference, x, steps, 4, CategoricalSchedule(50), repeats)
    base = out["schedules"]["eager_fp32"]
    out.update(
        {
            "uc_ms": base["uc_ms"],
            "card_ms": base["card_ms"],
            "ratio": round(base["card_ms"] / base["uc_ms"], 3),
            "floor": base["floor"],
        }
    )
    out["paper"] = {"uc_ms": 1736.8, "card_ms": 2015.5, "ratio": 1.16}
    return out


def bundle_timing(smoke: bool, repeats: int = 10) -> dict:
    """The shipped bundle's networks on one 10-slice phantom volume (its real grid and weights)
    under every execution schedule: the overhead a user of ``cardseg segment --device cuda`` sees."""
    no_simpleitk()
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import network_inputs

    cuda = torch.cuda.is_available() and not smoke
    dev = "cuda" if cuda else "cpu"
    vol, _ = synthetic_cine_volume((10, 216, 256) if not smoke else (2, 64, 64), seed=3)
    b = load_bundle(device=dev)
    x, _ = network_inputs(vol, b)
    x = x.float().to(dev)
    res = {"bundle": b.ident, "input": list(x.shape), "device": torch.cuda.get_device_name() if cuda else "cpu"}
    res["schedules"] = schedule_variants(
        b.primary, b.reference, x, b.sampled_steps, b.num_classes, b.schedule, repeats if not smoke else 2
    )
    return res


def run_checks(out: Path, smoke: bool) -> dict:
    res: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name()
    for key, fn in (
        ("paper_scale_timing", paper_scale_timing),
        ("bundle_timing", bundle_timing),
        ("cuda_consistency", cuda_consistency),
    ):
        t0 = time.perf_counter()
        try:
            res[key] = fn(smoke)
        except Exception as exc:  # noqa: BLE001 - one failed check must not stop the run
            res[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        res[key + "_s"] = round(time.perf_counter() - t0, 1)
        (out / "engine.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items()}, default=str)[:3000], flush=True)
    return res

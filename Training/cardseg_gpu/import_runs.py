"""Turn what a GPU run returned into ordinary training-run folders (``cardseg train export`` reads them).

    python Training/cardseg_gpu/import_runs.py RETURNED_DIR [RETURNED_DIR ...] --pack Training/cardseg_gpu/pack --out runs/gpu

``RETURNED_DIR`` holds the files :mod:`run` wrote (``primary.safetensors``, ``reference_*.safetensors``,
``reference_unet.safetensors``, ``deterministic.safetensors``, ``log.jsonl``). When several are
given, a later one's file replaces an earlier one's (a continued run returns a newer primary);
their logs are kept together. Each network becomes a run folder with ``config.json`` (the
recipe as a :class:`cardseg_train.training.config.TrainConfig`, on the pack's grid), ``best.pt`` and
``last.pt`` (plain state dicts, fp32) and ``summary.json`` (steps, time, hardware, validation
Dice). References become one folder per saved step (``reference-mini-s2000``,
``reference-unet-s1000``, ...), so the maturity axis can be compared like any other runs.
Run folders belong outside git (``runs/`` is ignored).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("CARDSegment", "Training"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

import torch  # noqa: E402

from cardseg_gpu.jobs import JOBS  # noqa: E402

#: folder-name stem of each job's runs: the job's name with dashes, except the Mini SwinUNETR
#: reference, whose runs have always been called ``reference-mini``
STEMS = {job: {"reference": "reference-mini"}.get(job, job.replace("_", "-")) for job in JOBS}


def _read(path: Path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("cardseg", "{}"))
        tensors = {
            k: f.get_tensor(k).float() if f.get_tensor(k).is_floating_point() else f.get_tensor(k) for k in f.keys()
        }
    return tensors, meta


def _config(meta: dict, pack: dict, role: str):
    from cardseg.method.diffusion import default_sampling_steps
    from cardseg_train.training.config import TrainConfig

    spec = meta["network"]
    if spec["arch"] == "discriminative":
        from cardseg.method.networks import SWIN_SIZES

        backbone = spec.get("backbone", "swinunetr")
        width = {v: k for k, v in SWIN_SIZES.items()}.get(int(spec.get("feature_size", 12)))
        network = f"discriminative:{backbone}" + (f"-{width}" if backbone == "swinunetr" else "")
    else:
        network = f"{spec['arch']}:{spec['size']}"
    cfg = TrainConfig(
        data="acdc",
        data_format="acdc-h5",
        role=role,
        network=network,
        spacing=float(pack["pixel_spacing_mm"]),
        input_size=int(pack["input_size"]),
        low_percentile=float(pack["preprocessing"]["low_percentile"]),
        high_percentile=float(pack["preprocessing"]["high_percentile"]),
        batch_size=int(meta["batch_size"]),
        lr=float(meta["lr"]),
        lr_schedule="cosine",
        time_budget_min=round(float(meta["budget_s"]) / 60.0, 2),
        device="cuda",
        amp=True,
        seed=int(meta.get("seed", 0)),
        warmup=0,
        num_steps=50,
        sampled_steps=default_sampling_steps(50, 5),
        p_uncond=float(meta.get("p_uncond", 0.2)),
        p_focus=float(meta.get("p_focus", 0.0)),
    )
    d = cfg.to_dict()
    d["network_spec"] = spec
    d["trained_by"] = "Training/cardseg_gpu/run.py (time-based cosine schedule, bf16 autocast, AdamW, EMA where named)"
    return d


def _write_run(out: Path, cfg: dict, state: Dict[str, torch.Tensor], step: int, val: dict, summary: dict) -> None:
    from cardseg_train.training.runs import CHECKPOINT_FORMAT, CHECKPOINT_VERSION

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for kind in ("best", "last"):
        torch.save(
            {
                "format": CHECKPOINT_FORMAT,
                "version": CHECKPOINT_VERSION,
                "kind": kind,
                "step": int(step),
                "model": state,
                "val": dict(val),
                "network": cfg["network_spec"],
            },
            out / f"{kind}.pt",
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _logs(dirs: List[Path]) -> List[dict]:
    rows = []
    for d in dirs:
        p = d / "log.jsonl"
        if p.is_file():
            rows += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return rows


def import_runs(dirs: List[Path], pack_json: Path, out: Path) -> List[Path]:
    pack = json.loads(pack_json.read_text())
    files: Dict[str, Path] = {}
    for d in dirs:
        for f in sorted(d.glob("*.safetensors")):
            files[f.stem] = f  # a later folder replaces an earlier one's file
    logs = _logs(dirs)
    done = {}
    for r in logs:
        if r.get("event") == "done":
            done.setdefault(r["job"], []).append(r)
    made = []
    for stem, path in sorted(files.items()):
        tensors, meta = _read(path)
        job = meta.get("job", stem if stem in STEMS else stem.split("_")[0])
        cfg = _config(
            meta,
            pack,
            "reference"
            if job.startswith("reference")
            else "deterministic"
            if job.startswith("deterministic")
            else "aleatoric"
            if job == "aleatoric"
            else "primary",
        )
        history = done.get(job, [])
        # a continued run's steps add to the first run's
        total_steps = sum(int(h.get("steps", 0)) for h in history)
        total_time = sum(float(h.get("elapsed_s", 0.0)) for h in history)
        common = {
            "data": pack["data"],
            "format": "acdc-h5",
            "train_patients": pack["split"]["train"],
            "val_patients": pack["split"]["val"],
            "hardware": meta.get("device"),
            "pack_sha256": pack.get("data_sha256"),
            "imported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "runs": [
                {k: h.get(k) for k in ("steps", "elapsed_s", "batch_size", "lr", "budget_s", "init_from")}
                for h in history
            ],
        }
        if "checkpoints" in meta:  # a reference saved at several training lengths
            for s, val in meta["checkpoints"].items():
                state = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"step{s}.")}
                run = out / f"{STEMS[job]}-s{s}"
                summary = {
                    **common,
                    "role": "reference",
                    "network": meta["network"],
                    "steps_done": int(s),
                    "elapsed_s": None,
                    "best": {"dice": val.get("dice"), "step": int(s)},
                    "last_val": val,
                    "parameters": meta.get("parameters"),
                }
                _write_run(run, cfg, state, int(s), val, summary)
                made.append(run)
        else:
            val = meta.get("val", {})
            run = out / STEMS[job]
            summary = {
                **common,
                "role": cfg["role"],
                "network": meta["network"],
                "steps_done": total_steps,
                "checkpoint_step_of_last_run": meta.get("step"),
                "elapsed_s": round(total_time, 1),
                "best": {"dice": val.get("dice"), "step": meta.get("step"), "weights": val.get("weights")},
                "last_val": val,
                "parameters": meta.get("parameters"),
            }
            _write_run(run, cfg, tensors, int(meta.get("step", 0)), val, summary)
            made.append(run)
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Turn a GPU run's returned files into run folders.")
    ap.add_argument("returned", nargs="+", help="folders the GPU run's files came back to (later ones win)")
    ap.add_argument(
        "--pack", default=str(ROOT / "Training" / "cardseg_gpu" / "pack"), help="the pack the run trained on"
    )
    ap.add_argument("--out", default="runs/gpu")
    a = ap.parse_args(argv)
    for run in import_runs([Path(d) for d in a.returned], Path(a.pack) / "pack.json", Path(a.out)):
        print(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``cardseg train export``: a bundle from a primary run and a reference run (or one plain
segmentor run, or two for the Dual U-Net control), with what the bundle records of each run.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, NamedTuple, Optional, Tuple

from cardseg.base.errors import CardsegError
from cardseg.method.networks import count_parameters

from cardseg_train.training.runs import load_run_network
from cardseg_train.training.config import TrainConfig, data_name, is_machine_path, read_run_config


def _run_data_name(summary: dict, cfg: TrainConfig) -> str:
    """The run's data as provenance names it; summaries written before names were recorded hold
    an absolute path, which is reduced to its name here."""
    fmt = summary.get("format", cfg.data_format)
    data = summary.get("data")
    if data is None or is_machine_path(data):
        return data_name(data or cfg.data, fmt)
    return data


def _run_provenance(run: Path, cfg: TrainConfig, meta: dict, which: str) -> dict:
    """What a bundle records of one training run: names and numbers, no machine's folders."""
    summary = {}
    if (run / "summary.json").is_file():
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    return {
        "run": run.resolve().name,
        "network": f"{cfg.network}",
        "checkpoint": which,
        "checkpoint_step": meta.get("step"),
        "val_dice": (meta.get("val") or {}).get("dice")
        if which == "best"
        else (summary.get("last_val") or {}).get("dice"),
        "val": meta.get("val") if which == "best" else summary.get("last_val"),
        "steps_done": summary.get("steps_done", meta.get("step")),
        "training_time_s": summary.get("elapsed_s", meta.get("elapsed_s")),
        "hardware": summary.get("hardware"),
        "data": _run_data_name(summary, cfg),
        "data_format": summary.get("format", cfg.data_format),
        "split": {"train_patients": summary.get("train_patients"), "val_patients": summary.get("val_patients")},
        "recipe": {
            "batch_size": cfg.batch_size,
            "lr": cfg.lr,
            "warmup": cfg.warmup,
            "lr_schedule": cfg.lr_schedule,
            "p_uniform": cfg.p_uniform,
            "p_uncond": cfg.p_uncond,
            "p_focus": cfg.p_focus,
            "seed": cfg.seed,
            "loss": cfg.loss.to_dict(),
            "augment": cfg.augment.to_dict(),
            "acdc_h5_spacing_mm": cfg.acdc_h5_spacing if cfg.data_format == "acdc-h5" else None,
        },
    }


#: what a primary and its reference must share (TrainConfig attribute names)
SHARED = ("spacing", "input_size", "num_steps", "classes", "low_percentile", "high_percentile", "sampled_steps")


def _shared(cfg: TrainConfig) -> dict:
    """A run's :data:`SHARED` values (classes by name, steps as a list)."""
    values = {key: getattr(cfg, key) for key in SHARED}
    values["classes"] = [c["name"] for c in values["classes"]]
    values["sampled_steps"] = list(values["sampled_steps"])
    return values


def _pairs(a: dict, b: dict):
    """``(key, (a[key], b[key]))`` for each key of :data:`SHARED`."""
    return [(key, (a[key], b[key])) for key in SHARED]


def check_roles(primary_run: Path, reference_run: Path) -> None:
    """Each diffusion run given in the place its recorded role (``config.json``'s ``role``) names:
    a reference run as ``--primary`` or a primary run as ``--reference`` is refused in one line,
    before any checkpoint is read. Plain segmentor runs (a plain bundle, the Dual U-Net pair) keep
    their own roles and are checked by :func:`export_bundle`."""
    for option, run, want in (("--primary", primary_run, "primary"), ("--reference", reference_run, "reference")):
        cfg = read_run_config(run)
        if cfg.kind == "diffusion" and cfg.role != want:
            raise CardsegError(
                f"{option} {run}: is a {cfg.role} run (its config.json records role {cfg.role!r}, "
                f"network {cfg.network}); {option} takes a run trained with --role {want}"
            )


@dataclass(frozen=True)
class ExportOptions:
    """How :func:`export_bundle` writes a bundle.

    name: the bundle's name (``bundle.json`` ``id``); version: its version; primary_checkpoint,
    reference_checkpoint: which checkpoint of each run goes in (``best``: the best validated,
    ``last``: the last saved); overwrite: whether a bundle already at the destination may be
    replaced (never a folder of other files); fp16: store the weights as float16 (else float32)."""

    name: str = "acdc"
    version: str = "0.1.0"
    primary_checkpoint: str = "best"
    reference_checkpoint: str = "last"
    overwrite: bool = False
    fp16: bool = True


class _LoadedRun(NamedTuple):
    """One run as a bundle takes it: its folder, network, training config, checkpoint record
    (``step``, ``val``, ...) and which checkpoint (``best`` or ``last``) was read."""

    path: Path
    net: Any
    cfg: TrainConfig
    meta: dict
    checkpoint: str


def _load_run(run: Path, checkpoint: str) -> _LoadedRun:
    net, cfg, meta = load_run_network(run, checkpoint)
    return _LoadedRun(run, net, cfg, meta, checkpoint)


def _bundle_reference(p: _LoadedRun, r: _LoadedRun) -> Tuple[_LoadedRun, Optional[dict]]:
    """The reference the bundle holds and its ``segmentor`` entry (``None`` for a diffusion pair).

    One plain run given as both runs is a plain bundle: the reference is the segmentor itself (the
    primary's checkpoint), so the TAC is 0. Two deterministic runs of one network are the Dual
    U-Net control: the "TAC" is the JS of their softmaxes. Any other mix is refused."""
    if (p.cfg.kind == "diffusion") != (r.cfg.kind == "diffusion"):
        raise CardsegError(
            "a bundle holds two diffusion denoisers, or one plain segmentor given as both "
            f"--primary and --reference (got roles {p.cfg.role} and {r.cfg.role})"
        )
    if p.cfg.kind == "diffusion":
        return r, None
    if p.path.resolve() == r.path.resolve():
        # one forward pass ("step 0"); the reference is the segmentor itself, so the TAC is 0
        return p._replace(path=r.path), {"kind": p.cfg.kind}
    # the Dual U-Net control: two plain segmentors; the "TAC" is the JS of their softmaxes
    if p.cfg.kind != "deterministic" or r.cfg.kind != "deterministic" or p.cfg.network != r.cfg.network:
        raise CardsegError(
            "a dual-segmentor bundle takes two deterministic runs of one network "
            f"(got {p.cfg.role} {p.cfg.network} and {r.cfg.role} {r.cfg.network})"
        )
    return r, {"kind": "dual", "seeds": [p.cfg.seed, r.cfg.seed]}


def _export_warnings(p: _LoadedRun, r: _LoadedRun, plain: bool) -> List[str]:
    """What is exported but warned about: a diffusion reference larger than its primary, runs
    trained on other data or another split."""
    warnings = []
    n_ref, n_primary = count_parameters(r.net), count_parameters(p.net)
    if not plain and n_ref > n_primary:
        warnings.append(
            f"the reference ({r.cfg.network}, {n_ref} parameters) is larger than the primary "
            f"({p.cfg.network}, {n_primary}): CARD expects a capacity-limited reference"
        )
    for key in ("data", "data_format", "acdc_h5_spacing", "val_fraction"):
        a, b = getattr(p.cfg, key), getattr(r.cfg, key)
        if a != b:
            warnings.append(f"primary and reference runs differ in {key}: {a!r} vs {b!r}")
    return warnings


def _bundle_config(
    p: _LoadedRun, r: _LoadedRun, options: ExportOptions, segmentor: Optional[dict], warnings: List[str]
) -> dict:
    """``bundle.json`` of the pair: the engine's default configuration on the primary's grid,
    classes and steps (``[0]`` for a plain segmentor), the ``segmentor`` entry, the primary's
    normalisation percentiles and the provenance of both runs."""
    from cardseg.bundle.loading import BundleSpec, default_config

    plain = p.cfg.kind != "diffusion"
    strip = lambda spec: {k: v for k, v in spec.items() if k != "num_classes"}  # noqa: E731
    spec = BundleSpec(
        options.name,
        p.cfg.classes,
        strip(p.cfg.network_spec()),
        strip(r.cfg.network_spec()),
        p.cfg.spacing,
        p.cfg.input_size,
        version=options.version,
        num_steps=p.cfg.num_steps,
        sampled_steps=[0] if plain else list(p.cfg.sampled_steps),
    )
    config = default_config(spec)
    if segmentor:
        config["segmentor"] = segmentor
    config["preprocessing"].update({"low_percentile": p.cfg.low_percentile, "high_percentile": p.cfg.high_percentile})
    config["provenance"] = {
        "training": {
            "primary": _run_provenance(p.path, p.cfg, p.meta, p.checkpoint),
            "reference": _run_provenance(r.path, r.cfg, r.meta, r.checkpoint),
        },
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "weights_dtype": "float16" if options.fp16 else "float32",
        "warnings": warnings,
    }
    return config


def export_bundle(
    primary_run: os.PathLike, reference_run: os.PathLike, out: os.PathLike, options: ExportOptions = ExportOptions()
) -> Path:
    """Assemble a bundle from a trained primary run and a reference run (engine :func:`save_bundle`).

    A *plain* bundle wraps one deterministic or aleatoric run (given as both runs) so the
    conventional baselines fit and evaluate through the same engine path: one forward pass
    (``sampled_steps`` ``[0]``), the TAC identically 0, ``"segmentor": {"kind": ...}`` recorded.
    Two deterministic runs of one network (different seeds) make the Dual U-Net control: the
    "TAC" is then the JS between their softmaxes, and CARD's fitted sigmoid temperature acts on
    the first one's logits (``"segmentor": {"kind": "dual"}``).

    The primary defaults to its best validated checkpoint; the reference to its last one (the
    paper fixes the reference's training length a priori instead of selecting it). Both runs
    must share the grid (spacing, size), the classes, the diffusion horizon and the
    preprocessing. Provenance (data, split, steps, time, hardware, validation Dice) is recorded.
    Each diffusion run must have been trained for its place (:func:`check_roles`); a reference with
    more parameters than the primary is exported with a warning (stderr and provenance), since the
    capacity analysis of the paper compares such references too.
    """
    from cardseg.bundle.loading import save_bundle
    from cardseg.bundle.scaffold import check_bundle_destination

    check_bundle_destination(out, options.overwrite)  # an --overwrite replaces a bundle, never a folder of other files
    p_run, r_run = Path(primary_run), Path(reference_run)
    check_roles(p_run, r_run)
    p = _load_run(p_run, options.primary_checkpoint)
    r, segmentor = _bundle_reference(p, _load_run(r_run, options.reference_checkpoint))
    for key, (a, b) in _pairs(_shared(p.cfg), _shared(r.cfg)):
        if a != b:
            raise CardsegError(f"primary and reference runs differ in {key} ({a!r} vs {b!r})")
    warnings = _export_warnings(p, r, plain=p.cfg.kind != "diffusion")
    for w in warnings:
        print(f"cardseg: warning: {w}", file=sys.stderr)
    config = _bundle_config(p, r, options, segmentor, warnings)
    return save_bundle(out, config, p.net, r.net, fp16=options.fp16, overwrite=options.overwrite)


def swap_reference(
    bundle_dir: os.PathLike,
    reference_run: os.PathLike,
    out: os.PathLike,
    reference_checkpoint: str = "last",
    version: str = None,
    overwrite: bool = False,
) -> Path:
    """A copy of the diffusion bundle at ``bundle_dir`` whose reference is the network of
    ``reference_run`` (its ``reference_checkpoint``): :func:`swap_network` for the reference. The
    primary's weight file is copied byte for byte; configuration, calibration and regions are
    kept (fit them again: the TAC changed)."""
    return swap_network(bundle_dir, reference_run, out, "reference", reference_checkpoint, version, overwrite)


def swap_primary(
    bundle_dir: os.PathLike,
    primary_run: os.PathLike,
    out: os.PathLike,
    checkpoint: str = "best",
    version: str = None,
    overwrite: bool = False,
) -> Path:
    """A copy of the diffusion bundle at ``bundle_dir`` whose primary is the network of
    ``primary_run``: :func:`swap_network` for the primary. The reference's weight file is copied
    byte for byte. Every fitted block was fitted on the old primary's outputs, so the copy keeps
    only the current region rule (as a starting point; ``regions.previous`` is dropped: those
    rules belong to the old primary) and must be fitted again before use: ``fit-calibration``,
    ``fit-review`` and the index intervals."""
    return swap_network(bundle_dir, primary_run, out, "primary", checkpoint, version, overwrite)


def swap_network(
    bundle_dir: os.PathLike,
    run: os.PathLike,
    out: os.PathLike,
    role: str,
    checkpoint: str,
    version: str = None,
    overwrite: bool = False,
) -> Path:
    """A copy of the diffusion bundle at ``bundle_dir`` whose ``role`` network (``primary`` or
    ``reference``) is the network of the training run ``run`` (its ``checkpoint``), written to
    ``out`` (another folder: the original, model card included, is never replaced). The other
    network's weight file is copied byte for byte (same hash, same dtype); the swapped network's
    ``networks`` entry and provenance are the new run's, the swap is recorded
    (``provenance.<role>_swapped_from``) and ``version`` (if given) replaces the bundle's. A run
    of another role, or on another grid, horizon, step set, class list or normalisation is refused."""
    from cardseg.bundle.folder import check_bundle
    from cardseg.bundle.loading import load_network, save_bundle
    from cardseg.bundle.scaffold import check_bundle_destination

    other = {"primary": "reference", "reference": "primary"}[role]
    checked = check_bundle(bundle_dir)
    if Path(out).resolve() == Path(checked.root).resolve():
        raise CardsegError(f"{out}: is the bundle itself; write the swapped bundle to another folder")
    check_bundle_destination(out, overwrite)
    config = json.loads(json.dumps(checked.config))
    if config.get("segmentor"):
        raise CardsegError(f"{bundle_dir}: a {config['segmentor'].get('kind')} bundle has no diffusion {role} to swap")
    run = Path(run)
    network, cfg, meta = load_run_network(run, checkpoint)
    if cfg.kind != "diffusion" or cfg.role != role:
        raise CardsegError(f"{run}: a {cfg.role} run cannot be a diffusion bundle's {role}")
    pre = config["preprocessing"]
    bundle_values = {
        "spacing": config["pixel_spacing_mm"],
        "input_size": config["input_size"],
        "num_steps": config["diffusion"]["num_steps"],
        "classes": [c["name"] for c in config["classes"]],
        "low_percentile": pre.get("low_percentile"),
        "high_percentile": pre.get("high_percentile"),
        "sampled_steps": list(config["diffusion"]["sampled_steps"]),
    }
    for key, (want, have) in _pairs(_shared(cfg), bundle_values):
        if want != have:
            raise CardsegError(f"{run}: {key} {want!r} differs from the bundle's {have!r}")
    kept = load_network(checked.root, config, other, checked.weights[other])
    config["networks"][role] = {k: v for k, v in cfg.network_spec().items() if k != "num_classes"}
    provenance = config.setdefault("provenance", {})
    provenance.setdefault("training", {})[role] = _run_provenance(run, cfg, meta, checkpoint)
    provenance[f"{role}_swapped_from"] = f"{run.resolve().name} ({checkpoint})"
    if role == "primary" and isinstance(config.get("regions"), dict):
        config["regions"].pop("previous", None)
    if version:
        config["id"]["version"] = version
    fp16 = {e["dtype"] for e in checked.weights[other].tensors.values()} == {"F16"}
    kept_file = Path(checked.root) / config["networks"][other]["file"]
    nets = {role: network, other: kept}
    return save_bundle(
        out, config, nets["primary"], nets["reference"], fp16=fp16, overwrite=overwrite, keep_files={other: kept_file}
    )

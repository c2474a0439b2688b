"""Model bundles: a folder with ``bundle.json``, ``primary.safetensors`` and ``reference.safetensors``.

Weights are safetensors only (never pickle) and are verified against the sha256 recorded in
``bundle.json`` before anything is loaded. Calibration fitting rewrites ``bundle.json`` only.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import nn

from .calibration import Calibrator, calibrator_from_dict
from .diffusion import CategoricalSchedule
from .errors import CardsegError
from .networks import build_network, count_parameters

SCHEMA_VERSION = 1
ENV_VAR = "CARDSEG_BUNDLE"
DEFAULT_NAME = "acdc"
BUNDLES_DIR = Path(__file__).resolve().parent / "bundles"
ROLES = ("primary", "reference")
#: keys of bundle.json's "calibration" block that describe the fit rather than parameterise it
CALIBRATION_META = ("fitted", "fit", "tac_steps")


def sha256_file(path: os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_config(name: str, classes: List[dict], primary: dict, reference: dict, pixel_spacing_mm: float,
                   input_size: int, version: str = "0.0.0", num_steps: int = 50,
                   sampled_steps: Optional[List[int]] = None) -> dict:
    """A complete ``bundle.json`` dictionary with unfitted calibration defaults."""
    from .diffusion import default_sampling_steps

    return {
        "schema_version": SCHEMA_VERSION,
        "id": {"name": name, "version": version},
        "classes": classes,
        "image_channels": 1,
        "pixel_spacing_mm": float(pixel_spacing_mm),
        "input_size": int(input_size),
        "preprocessing": {"normalization": "slice-percentile", "low_percentile": 0.5, "high_percentile": 99.5,
                          "pad_value": 0.0},
        "diffusion": {"schedule": "cosine", "num_steps": int(num_steps), "s": 0.008,
                      "sampled_steps": sampled_steps or default_sampling_steps(num_steps)},
        "networks": {"primary": dict(primary), "reference": dict(reference)},
        "calibration": {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05, "fitted": False},
        "regions": {"flag_threshold": 0.1, "min_voxels": 10},
        "agreement": {"roi_dilation_px": 10, "out_of_domain_threshold": None},
        "provenance": {},
    }


@dataclass
class Bundle:
    """A loaded bundle: its folder, its configuration and both networks (eval mode)."""

    path: Path
    config: dict
    primary: nn.Module
    reference: nn.Module
    checksums: Dict[str, str] = field(default_factory=dict)

    @property
    def class_names(self) -> List[str]:
        return [c["name"] for c in self.config["classes"]]

    @property
    def num_classes(self) -> int:
        return len(self.config["classes"])

    @property
    def schedule(self) -> CategoricalSchedule:
        d = self.config["diffusion"]
        return CategoricalSchedule(num_steps=int(d["num_steps"]), s=float(d.get("s", 0.008)))

    @property
    def sampled_steps(self) -> List[int]:
        return [int(s) for s in self.config["diffusion"]["sampled_steps"]]

    @property
    def tac_steps(self) -> Optional[List[int]]:
        """Steps the TAC average runs over (paper Eq. 6's set T): ``calibration.tac_steps`` in
        ``bundle.json``, or ``None`` for every sampled step (the paper's default)."""
        steps = self.config.get("calibration", {}).get("tac_steps")
        if steps is None:
            return None
        steps = [int(s) for s in steps]
        if not steps or not set(steps) <= set(self.sampled_steps):
            raise CardsegError(f"{self.path}: calibration.tac_steps {steps} must be a non-empty subset of the "
                               f"sampled steps {self.sampled_steps}")
        return steps

    @property
    def calibrator(self) -> Calibrator:
        cal = {k: v for k, v in self.config["calibration"].items() if k not in CALIBRATION_META}
        return calibrator_from_dict(cal)

    @property
    def ident(self) -> str:
        i = self.config["id"]
        return f"{i['name']}-{i['version']}"

    def to(self, device) -> "Bundle":
        self.primary.to(device)
        self.reference.to(device)
        return self


def resolve_bundle_path(path: Optional[os.PathLike] = None) -> Path:
    """``--bundle`` if given, else ``$CARDSEG_BUNDLE``, else the shipped default bundle."""
    chosen = path or os.environ.get(ENV_VAR) or (BUNDLES_DIR / DEFAULT_NAME)
    p = Path(chosen)
    if not (p / "bundle.json").is_file():
        if path is None and not os.environ.get(ENV_VAR):
            raise CardsegError(f"no default bundle at {p}; pass --bundle PATH (an untrained one: cardseg init-bundle)")
        raise CardsegError(f"{p}: not a bundle (no bundle.json)")
    return p


def read_config(path: os.PathLike) -> dict:
    p = Path(path) / "bundle.json"
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CardsegError(f"{p}: unreadable bundle.json ({exc})") from None
    if config.get("schema_version") != SCHEMA_VERSION:
        raise CardsegError(f"{p}: schema_version {config.get('schema_version')!r}, this cardseg reads {SCHEMA_VERSION}")
    for key in ("id", "classes", "pixel_spacing_mm", "input_size", "diffusion", "networks", "calibration"):
        if key not in config:
            raise CardsegError(f"{p}: missing key {key!r}")
    return config


def load_bundle(path: Optional[os.PathLike] = None, device: str | torch.device = "cpu") -> Bundle:
    """Load and verify a bundle (see :func:`resolve_bundle_path` for how ``path`` is chosen)."""
    from safetensors.torch import load_file

    root = resolve_bundle_path(path)
    config = read_config(root)
    nets = {}
    checksums = {}
    for role in ROLES:
        spec = config["networks"].get(role)
        if spec is None:
            raise CardsegError(f"{root}: bundle.json has no {role} network")
        wfile = root / spec.get("file", f"{role}.safetensors")
        if not wfile.is_file():
            raise CardsegError(f"{root}: missing weight file {wfile.name}")
        digest = sha256_file(wfile)
        if digest != spec.get("sha256"):
            raise CardsegError(f"{wfile}: checksum mismatch (file is truncated, altered or not this bundle's)")
        checksums[wfile.name] = digest
        try:
            net = build_network({**spec, "num_classes": len(config["classes"])})
            state = load_file(str(wfile))
            net.load_state_dict(state, strict=True)
        except (ValueError, RuntimeError, KeyError) as exc:
            raise CardsegError(f"{wfile}: weights do not fit the {spec.get('arch')} network ({str(exc).splitlines()[0][:160]})") from None
        nets[role] = net.float().eval().to(device)
    return Bundle(path=root, config=config, primary=nets["primary"], reference=nets["reference"], checksums=checksums)


def save_bundle(path: os.PathLike, config: dict, primary: nn.Module, reference: nn.Module, fp16: bool = True,
                overwrite: bool = False) -> Path:
    """Write a bundle folder atomically (weights as safetensors, sha256 into ``bundle.json``)."""
    from safetensors.torch import save_file

    dest = Path(path)
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise CardsegError(f"{dest}: exists and is not empty (use overwrite)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=dest.parent))
    try:
        for role, net in zip(ROLES, (primary, reference)):
            dtype = torch.float16 if fp16 else torch.float32
            state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in net.state_dict().items()}
            fname = f"{role}.safetensors"
            save_file(state, str(tmp / fname), metadata={"role": role, "format": "pt"})
            spec = config["networks"][role]
            spec.update({"file": fname, "sha256": sha256_file(tmp / fname), "parameters": count_parameters(net),
                         "dtype": "float16" if fp16 else "float32"})
        (tmp / "bundle.json").write_text(json.dumps(config, indent=2) + "\n")
        for f in tmp.iterdir():
            _readable(f)
        _readable(tmp, directory=True)
        _replace_dir(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def update_config(path: os.PathLike, changes: dict) -> dict:
    """Merge ``changes`` (top-level keys, dicts merged one level deep) into ``bundle.json``.

    Written atomically; the weights are never touched.
    """
    root = Path(path)
    config = read_config(root)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    fd, tmp = tempfile.mkstemp(prefix=".bundle-", suffix=".json", dir=root)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    _readable(Path(tmp))
    os.replace(tmp, root / "bundle.json")
    return config


def _readable(path: Path, directory: bool = False) -> None:
    """Give a file made by ``tempfile`` (mode 0600/0700) the usual mode under the umask, so a
    bundle written by one user (e.g. an installer) can be read by the others."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def _replace_dir(src: Path, dest: Path) -> None:
    """Move the finished folder ``src`` to ``dest``, replacing what was there only at the end."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(src, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dest)

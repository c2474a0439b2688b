"""Finding a bundle folder and checking it whole, without torch.

:func:`check_bundle_folder` resolves ``--bundle`` (or ``$CARDSEG_BUNDLE``, or the shipped
default), checks ``bundle.json`` against the schema and each weight file's checksum and header,
so a command can refuse a broken bundle before it reads any input or imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from cardseg.base.errors import CardsegError, show
from cardseg.bundle.schema import validate_config
from cardseg.bundle.weights import WeightFile, verify_weights
from cardseg.base.strictjson import bounded_loads

ENV_VAR = "CARDSEG_BUNDLE"
DEFAULT_NAME = "acdc"
BUNDLES_DIR = Path(__file__).resolve().parent.parent / "bundles"


def resolve_bundle_path(path: Optional[os.PathLike] = None) -> Path:
    """``--bundle`` if given, else ``$CARDSEG_BUNDLE`` (an empty one counts as unset), else the
    shipped default bundle. An empty ``--bundle ""`` is refused, not taken for the default."""
    if path is not None and not str(path).strip():
        raise CardsegError("the bundle path is empty (leave --bundle out for the default bundle)")
    chosen = path or os.environ.get(ENV_VAR) or (BUNDLES_DIR / DEFAULT_NAME)
    p = Path(chosen)
    if not (p / "bundle.json").is_file():
        if path is None and not os.environ.get(ENV_VAR):
            raise CardsegError(f"no default bundle at {p}; pass --bundle PATH (an untrained one: cardseg init-bundle)")
        raise CardsegError(f"{p}: not a bundle (no bundle.json)")
    return p


def read_config(path: os.PathLike) -> dict:
    """The parsed ``bundle.json`` of the bundle folder ``path`` (read only, not validated)."""
    p = Path(path) / "bundle.json"
    try:
        config = bounded_loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CardsegError(f"{p}: unreadable bundle.json ({_one_line(exc)})") from None
    if not isinstance(config, dict):
        raise CardsegError(f"{p}: bundle.json must hold a JSON object (got {show(config)})")
    return config


@dataclass(frozen=True)
class CheckedBundle:
    """A bundle folder whose ``bundle.json`` and weight files passed every check that needs no
    torch: the folder, the validated configuration and ``{role: WeightFile}`` (with the verified
    bytes). :func:`cardseg.bundle.loading.load_bundle` accepts it, so a run checks once."""

    root: Path
    config: dict
    weights: Dict[str, WeightFile]


def check_bundle(path: Optional[os.PathLike] = None) -> CheckedBundle:
    """Resolve, read and fully check a bundle without torch.

    ``path`` is chosen as in :func:`resolve_bundle_path`. Checks ``bundle.json`` against the
    schema (:func:`validate_config`) and each weight file's checksum and safetensors header
    (:func:`verify_weights`); the network shapes are checked when the bundle is loaded.
    """
    root = resolve_bundle_path(path)
    config = validate_config(read_config(root), root)
    return CheckedBundle(root=root, config=config, weights=verify_weights(root, config))


def check_method(root: Path, config: dict, method: str) -> None:
    """``--method card`` needs a CARD-calibrated bundle: else a one-line :class:`CardsegError`."""
    if method == "card" and config["calibration"]["method"] != "card":
        raise CardsegError(
            f"{root}: the bundle is calibrated by {config['calibration']['method']!r}, "
            "not CARD; use --method uc or a CARD bundle"
        )


def check_bundle_folder(path: Optional[os.PathLike] = None) -> Tuple[Path, dict]:
    """:func:`check_bundle` → ``(folder, config)``."""
    checked = check_bundle(path)
    return checked.root, checked.config


def _one_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else type(exc).__name__

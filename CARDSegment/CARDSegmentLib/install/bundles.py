"""Choosing the model bundle without loading it (reads ``bundle.json`` only; no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

#: where the shipped default bundle lives, relative to the module folder
SHIPPED_BUNDLE = Path("cardseg") / "bundles" / "acdc"


class BundleChoiceError(ValueError):
    """The chosen bundle folder cannot be used; the message says why in one line."""


def shipped_bundle_dir(module_dir: os.PathLike) -> Path:
    return Path(module_dir) / SHIPPED_BUNDLE


def resolve_bundle(use_shipped: bool, folder: Optional[os.PathLike], module_dir: os.PathLike) -> Path:
    """The bundle folder to pass to ``--bundle``: the shipped default or the chosen folder."""
    if use_shipped:
        path = shipped_bundle_dir(module_dir)
        if not (path / "bundle.json").is_file():
            raise BundleChoiceError(
                "the trained default bundle is not shipped with this version yet; choose a bundle folder "
                "(an untrained one for trying the module out: cardseg init-bundle FOLDER)"
            )
        return path
    if not folder_text(folder):
        raise BundleChoiceError("choose a bundle folder (it holds bundle.json and two .safetensors files)")
    path = Path(folder)
    if not (path / "bundle.json").is_file():
        raise BundleChoiceError(f"{path}: not a bundle folder (no bundle.json)")
    return path


def folder_text(value: Optional[object]) -> str:
    """What the folder box shows for a stored folder: nothing when unset ("", None or ".")."""
    text = "" if value is None else str(value).strip()
    return "" if text in ("", ".") else text


def bundle_config(path: os.PathLike) -> dict:
    """The folder's ``bundle.json`` as a dictionary; a :class:`BundleChoiceError` (one line naming
    the file) when it cannot be read, is not JSON, or holds something other than a JSON object."""
    p = Path(path) / "bundle.json"
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleChoiceError(f"{p}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise BundleChoiceError(
            f"{p}: not a bundle description (a JSON {type(config).__name__}, where a JSON object was expected)"
        )
    return config


def bundle_classes(path: os.PathLike) -> List[dict]:
    """The bundle's classes (name, colour, optional terminology), background first."""
    classes = bundle_config(path).get("classes")
    if not isinstance(classes, list) or not classes:
        raise BundleChoiceError(f"{path}: bundle.json lists no classes")
    return classes


def bundle_label(path: os.PathLike) -> str:
    """ "name version" of a bundle, for the panel."""
    ident = bundle_config(path).get("id")
    ident = ident if isinstance(ident, dict) else {}
    return f"{ident.get('name', '?')} {ident.get('version', '')}".strip()

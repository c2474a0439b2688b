"""The suite keeps to itself: its processes and their children use a private model cache, so a
user's own runs beside the suite (which change ``~/.cache/cardseg``) never meet it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import PRIVATE_CACHE


def user_cache() -> Path:
    """Where a user's runs cache their models without ``$CARDSEG_CACHE_DIR``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "cardseg"


def test_this_process_caches_in_the_private_folder():
    from cardseg.bundle.onnx_cache import cache_dir

    assert cache_dir() == PRIVATE_CACHE
    assert PRIVATE_CACHE.is_dir() and user_cache() not in [PRIVATE_CACHE, *PRIVATE_CACHE.parents]


def test_a_child_process_caches_in_the_private_folder_too():
    code = "from cardseg.bundle.onnx_cache import cache_dir; print(cache_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()) == PRIVATE_CACHE

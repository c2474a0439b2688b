"""Importing the engine on the GPU machine, which has no SimpleITK."""

from __future__ import annotations

import sys


def no_simpleitk() -> None:
    """Let the engine's modules import where SimpleITK is absent: the array path used here never
    calls it (reading and writing files does, and stays untested on the GPU machine)."""
    import importlib.util

    if "SimpleITK" not in sys.modules and importlib.util.find_spec("SimpleITK") is None:
        import types

        sys.modules["SimpleITK"] = types.ModuleType("SimpleITK")

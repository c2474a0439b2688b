"""The subcommands other installed packages add to ``cardseg`` through the ``cardseg.commands``
entry points (the training tools: train, evaluate, fit-calibration, fit-review, fit-indices,
compare, ablate): found without importing them, loaded and run on demand, and a missing optional
package of theirs said in one line."""

from __future__ import annotations

from typing import List

from cardseg.base.errors import CardsegError

#: entry-point group through which installed packages add subcommands; the engine never imports them
PLUGIN_GROUP = "cardseg.commands"
#: what to install when a registered subcommand's package cannot be imported
PLUGIN_HINT = "pip install 'cardsegment[train]'"
#: the packages of that extra (pyproject.toml), which the training tools import only where needed
TRAIN_EXTRA = ("h5py", "torchio", "matplotlib")


def plugin_commands() -> dict:
    """``{name: entry point}`` of the subcommands registered under :data:`PLUGIN_GROUP`; each loads
    to a function taking the argument list after the name (its docstring's first line is its help)."""
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=PLUGIN_GROUP)
    except Exception:  # noqa: BLE001 - broken metadata must not break the engine's own commands
        return {}
    return {ep.name: ep for ep in found}


def plugin_help(ep) -> str:
    """The first line of the subcommand's docstring, or what to install when it cannot load."""
    try:
        doc = (ep.load().__doc__ or "").strip()
    except Exception:  # noqa: BLE001
        return f"(not available here: {PLUGIN_HINT})"
    return doc.splitlines()[0] if doc else ""


def run_plugin(name: str, ep, args: List[str]) -> int:
    """Run a subcommand another package registered (see :func:`plugin_commands`). One-line
    :class:`CardsegError` when its package, or an optional package of the ``[train]`` extra it
    imports on the way (:data:`TRAIN_EXTRA`), is not installed."""
    try:
        fn = ep.load()
    except ImportError as exc:
        raise CardsegError(f"'cardseg {name}' needs the training tools: {PLUGIN_HINT} ({exc})") from None
    try:
        return int(fn(args) or 0)
    except ModuleNotFoundError as exc:
        if exc.name not in TRAIN_EXTRA:
            raise
        raise CardsegError(f"'cardseg {name}' needs {exc.name} here: {PLUGIN_HINT}") from None

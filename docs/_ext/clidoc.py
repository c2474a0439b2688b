"""The parsers behind ``cardseg``'s command line, for the generated command-line reference.

:func:`engine_parser` is the engine's own parser (``cardseg.cli.build_parser``) without the
subcommands that installed packages add; :data:`PLUGIN_PARSERS` names, for every subcommand the
training tools register under the ``cardseg.commands`` entry points, the function in that entry
point's module that builds its parser. ``Testing/python/test_docs_cli.py`` checks that every
registered subcommand is listed here and that the built reference holds every option ``--help``
shows.
"""

from __future__ import annotations

import importlib

#: entry-point name -> (module, parser function); ``train`` also has its ``export`` step
PLUGIN_PARSERS = {
    "train": ("cardseg_train.commands.train", "train_parser"),
    "train export": ("cardseg_train.commands.train", "export_parser"),
    "evaluate": ("cardseg_train.commands.evaluate", "evaluate_parser"),
    "fit-calibration": ("cardseg_train.commands.fit", "fit_parser"),
    "fit-review": ("cardseg_train.commands.fit", "review_fit_parser"),
    "fit-indices": ("cardseg_train.commands.fit", "fit_indices_parser"),
    "compare": ("cardseg_train.commands.compare", "compare_parser"),
    "ablate": ("cardseg_train.commands.compare", "ablate_parser"),
}


def engine_parser():
    """``cardseg``'s parser with the engine's own subcommands only."""
    from cardseg.cli import build_parser

    return build_parser(plugins={})


def plugin_parser(name: str):
    """The parser of a training subcommand (a key of :data:`PLUGIN_PARSERS`)."""
    module, func = PLUGIN_PARSERS[name]
    parser = getattr(importlib.import_module(module), func)()
    parser.prog = f"cardseg {name}"
    return parser


def _factory(name: str):
    return lambda: plugin_parser(name)


# one module-level function per subcommand, as sphinx-argparse's :func: option wants
train = _factory("train")
train_export = _factory("train export")
evaluate = _factory("evaluate")
fit_calibration = _factory("fit-calibration")
fit_review = _factory("fit-review")
fit_indices = _factory("fit-indices")
compare = _factory("compare")
ablate = _factory("ablate")

"""The command line's parser and help formatter: one-line refusals, defaults stated once.

:class:`CommandLineParser` is argparse's parser with the refusal every other check of cardseg
gives: one line, ``cardseg: error: ...``, exit status 2 (argparse prints its whole usage block
first). :class:`DefaultsHelpFormatter` adds ``(default: X)`` to an option's help only when the
help does not already speak of its default and there is one to state (not ``None`` or ``False``).
"""

from __future__ import annotations

import argparse


class CommandLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit status 2 (its subcommand
    parsers are of the same class)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        self.exit(2, f"cardseg: error: {' '.join(str(message).split())} (see {self.prog} --help)\n")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with ``(default: X)`` where it informs: not after a help that already names its default,
    not for ``None``/``False`` defaults (a flag, an option that is simply left out)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text.lower()
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
        ):
            return text
        return super()._get_help_string(action)

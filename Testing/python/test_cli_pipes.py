"""A command whose standard output is closed by its reader (``cardseg sizes | head -1``) ends
quietly with 141 (128 + SIGPIPE), as other command-line tools do, not with an error line."""

from __future__ import annotations

import sys


class ClosedPipe:
    """A stdout whose reader went away: every write fails as a closed pipe does."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass

    def fileno(self):
        return self.fd


def test_a_closed_stdout_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    from cardseg.cli import main

    spare = open(tmp_path / "stdout", "wb")  # the descriptor the pipe had: pointed at /dev/null afterwards
    monkeypatch.setattr(sys, "stdout", ClosedPipe(spare.fileno()))
    try:
        assert main(["sizes"]) == 141
    finally:
        spare.close()
    assert capsys.readouterr().err == ""  # no "cardseg: error: Broken pipe"


def test_a_closed_stdout_without_a_descriptor_still_ends_quietly(monkeypatch, capsys):
    """A library caller's stdout (no file descriptor): 141 all the same, no traceback."""
    from cardseg.cli import main

    class NoDescriptor(ClosedPipe):
        def fileno(self):
            import io

            raise io.UnsupportedOperation("fileno")

    monkeypatch.setattr(sys, "stdout", NoDescriptor(-1))
    assert main(["sizes"]) == 141
    assert capsys.readouterr().err == ""

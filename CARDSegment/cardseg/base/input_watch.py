"""End a command when its standard input ends: the program that started it is gone.

A program that starts an engine child (the Slicer module) can hand it one end of a pipe as its
standard input and keep the other end open without ever writing to it. The operating system
closes that end when the program exits or crashes, on every platform and without any polling, so
the child reads end of input exactly then. :func:`watch_input` reads the input on a daemon
thread and calls ``on_eof()`` once it ends; ``on_line(raw)`` receives each line on the way
(``cardseg serve`` reads its requests so, ``cardseg segment --eof stop`` and ``cardseg batch
--eof stop`` drop them).

:func:`stop_on_eof` is the whole watchdog of a one-shot command: at end of input the command
stops as after SIGTERM (its cleanup runs, nothing half written stays) and the process ends a
grace period later if it has not by then (as :mod:`cardseg.base.parent_watch` stops it when the
process it watches is gone).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Optional

#: the exit status of a hard exit after the end of input (128 + SIGTERM, as a shell reports it)
EXIT_INPUT_GONE = 128 + int(signal.SIGTERM)
#: the longest line :func:`pump_lines` hands on whole; a longer one is dropped (``on_line(None)``)
MAX_LINE_BYTES = 1 << 20


def pump_lines(stream, on_line: Callable[[Optional[bytes]], None], max_bytes: int = MAX_LINE_BYTES) -> None:
    """Read ``stream`` (binary) to its end: ``on_line(raw)`` for every line of at most ``max_bytes``
    bytes, ``on_line(None)`` for a longer one (read to its end and dropped). A read error counts as
    the end."""
    try:
        while True:
            raw = stream.readline(max_bytes + 1)
            if not raw:
                return
            if len(raw) > max_bytes and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of the line is read and dropped
                    raw = stream.readline(max_bytes + 1)
                on_line(None)
                continue
            on_line(raw)
    except (OSError, ValueError):
        return


def watch_input(
    stream,
    on_eof: Callable[[], None],
    on_line: Optional[Callable[[Optional[bytes]], None]] = None,
    name: str = "cardseg-input-watch",
    max_bytes: int = MAX_LINE_BYTES,
) -> threading.Thread:
    """Start the daemon thread that reads ``stream`` (see :func:`pump_lines`; lines go to
    ``on_line`` when given, else nowhere) and calls ``on_eof()`` once it ends."""

    def run() -> None:
        pump_lines(stream, on_line or (lambda raw: None), max_bytes)
        on_eof()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


#: seconds from the SIGTERM-like stop at end of input to the hard exit, should the run not have
#: ended by then (a batch finishes the cases it is writing and its table: the stop stays within 5 s)
GRACE_S = 4.0


def stop_self(grace_s: float = GRACE_S) -> None:
    """Stop as SIGTERM stops a command, and end the process ``grace_s`` seconds later if it still
    runs: on POSIX by the kernel's SIGALRM (whose default action ends the process even while the
    main thread is inside a long native call), elsewhere from a timer thread."""
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, grace_s)
    else:
        timer = threading.Timer(grace_s, lambda: os._exit(EXIT_INPUT_GONE))
        timer.daemon = True
        timer.start()
    try:
        signal.raise_signal(signal.SIGTERM)
    except (OSError, ValueError, AttributeError):
        os._exit(EXIT_INPUT_GONE)


#: set once :func:`stop_on_eof` watches the input: the process must then end without the
#: interpreter's teardown (``os._exit``), which aborts while a daemon thread is blocked reading
#: standard input ("could not acquire lock for <stdin> at interpreter shutdown")
INPUT_WATCHED = threading.Event()


def stop_on_eof(stream=None) -> threading.Thread:
    """The watchdog of a one-shot command: when ``stream`` (default: this process's standard
    input) ends, :func:`stop_self` stops the command. Sets :data:`INPUT_WATCHED`."""
    INPUT_WATCHED.set()
    return watch_input(stream if stream is not None else sys.stdin.buffer, stop_self, name="cardseg-eof-stop")

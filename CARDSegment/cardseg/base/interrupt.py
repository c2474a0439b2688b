"""SIGTERM handled like Ctrl-C: a run that is told to stop (``kill``, a job scheduler, a container
that is stopped) cleans up exactly as after Ctrl-C, instead of dying where it stands."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

#: the exit status of a run ended by SIGTERM (128 + 15, as a shell reports it)
EXIT_TERMINATED = 128 + int(signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM arrives inside :func:`sigterm_as_interrupt`; a
    :class:`KeyboardInterrupt`, so every ``finally`` and ``except KeyboardInterrupt`` written for
    Ctrl-C runs for it too."""


class SigtermState:
    """What :func:`sigterm_as_interrupt` yields: ``received`` turns True when SIGTERM arrived (a
    library may turn the :class:`Terminated` it raised into a plain KeyboardInterrupt on its way)."""

    def __init__(self) -> None:
        self.received = False


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[SigtermState]:
    """Inside the block, SIGTERM raises :class:`Terminated` in the main thread (once; later ones
    are ignored while the cleanup runs); the previous handler is back afterwards. Outside the main
    thread (where Python cannot set handlers) it changes nothing."""
    state = SigtermState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def on_sigterm(signum, frame) -> None:
        state.received = True
        signal.signal(signum, signal.SIG_IGN)  # a second SIGTERM does not cut the cleanup short
        raise Terminated(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred(signums=(signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Inside the block, Ctrl-C and SIGTERM wait: a few steps that must not be cut in two (taking
    a lock and recording that it is held) run to their end, and a signal that arrived meanwhile is
    raised again as the block ends, to the handler that was in place before. Outside the main
    thread (where Python runs no handlers) it changes nothing; so for a signal whose handler was
    not set from Python."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list = []

    def hold(signum, frame) -> None:
        arrived.append(signum)

    old = {}
    try:
        for s in signums:
            if signal.getsignal(s) is not None:
                old[s] = signal.signal(s, hold)
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(arrived):  # each once, in the order they came
            signal.raise_signal(s)


@contextlib.contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """Put this process's SIGTERM handler back after the block: for a library call (``ray.init``)
    that installs its own, which would end the process without the cleanup."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and old is not None:
            signal.signal(signal.SIGTERM, old)


class ClientGone(KeyboardInterrupt):
    """Raised in the main thread by :func:`stop_from_thread`'s ``stop()`` (``cardseg serve``: the end
    of input stops a running request): a :class:`KeyboardInterrupt`, so the work cleans up as
    after Ctrl-C."""


@contextlib.contextmanager
def stop_from_thread() -> Iterator[Callable[[], None]]:
    """Yields ``stop()``, which any thread may call to raise :class:`ClientGone` in the main
    thread. Through a signal of the engine's own (SIGUSR1) where the system has one: Python's
    ``_thread.interrupt_main`` does nothing where SIGINT is ignored, as it is in a process that a
    script started in the background. Elsewhere (Windows) ``interrupt_main``."""
    import _thread

    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or threading.current_thread() is not threading.main_thread():
        yield _thread.interrupt_main
        return

    def on_stop(signum, frame) -> None:
        raise ClientGone("end of input")

    old = signal.signal(sig, on_stop)
    try:
        yield lambda: os.kill(os.getpid(), sig)
    finally:
        signal.signal(sig, old if old is not None else signal.SIG_DFL)


def shut_down_through_interrupts(pool: "ThreadPoolExecutor") -> None:
    """Cancel ``pool``'s work not started and wait for its threads; a KeyboardInterrupt meanwhile
    is raised once they have ended (a cancelled future never counts as done for ``wait``, so the
    threads, not the futures, are what is waited for)."""
    interrupted = None
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted

"""Ctrl-C or SIGTERM that lands while a lock is taken: the lock is either held (and the caller's
cleanup covers it) or gone, never a lock file that no run holds and no later run removes.

The signal is sent from inside the lock's own steps (its ``flock`` call), the window a loaded
machine made reachable in CI: a case's ``.c1.cardseg.lock`` stayed behind after Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from cardseg.base import files
from cardseg.base.errors import CardsegError
from cardseg.base.files import FileLock
from cardseg.base.interrupt import signals_deferred, sigterm_as_interrupt


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in these tests, as in a terminal, even where the test process
    inherited SIGINT ignored (a job started in the background, as CI runs it)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _signal_while_locking(monkeypatch, signum):
    """Make the next ``flock`` call send ``signum`` to this process just before it locks."""
    real = files._try_lock
    sent = []

    def try_lock(fd):
        if not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)
        return real(fd)

    monkeypatch.setattr(files, "_try_lock", try_lock)
    return sent


def test_signals_deferred_holds_a_signal_until_the_block_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")  # the block runs to its end
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_signals_deferred_hands_a_sigterm_to_the_handler_in_place():
    with sigterm_as_interrupt() as state:
        before = signal.getsignal(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
        assert state.received
    assert before is not signal.SIG_DFL


def test_signals_deferred_changes_nothing_outside_the_main_thread():
    seen = []

    def run():
        with signals_deferred():
            seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))

    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before] and before[0] is signal.default_int_handler


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch, signum):
    sent = _signal_while_locking(monkeypatch, signum)
    lock = FileLock(tmp_path / ".a.cardseg.lock")
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()
    assert sent == [signum]
    assert lock.fd is None and os.listdir(tmp_path) == []
    assert FileLock(tmp_path / ".a.cardseg.lock").acquire()  # and nothing holds it


def test_an_interrupt_while_a_writer_takes_its_lock_leaves_nothing(tmp_path, monkeypatch):
    from cardseg.io.outdir import OutputWriter, check_output

    out = check_output(tmp_path / "new" / "deeper" / "out")
    _signal_while_locking(monkeypatch, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with OutputWriter(out):
            pytest.fail("the block must not run")
    assert os.listdir(tmp_path) == []  # no lock, no temporary folder, no parent it created


def test_a_writer_refused_by_a_live_run_leaves_that_runs_files_alone(tmp_path):
    from cardseg.io.outdir import OutputWriter, check_output

    out = check_output(tmp_path / "out")
    with OutputWriter(out) as first:
        first.path("a.txt").write_text("1")
        with pytest.raises(CardsegError, match="another cardseg run is writing this folder now"):
            with OutputWriter(out):
                pytest.fail("the block must not run")
        assert (first.tmp / "a.txt").is_file() and first._lock.fd is not None  # the live run's files
        first.commit()
    assert (out / "a.txt").read_text() == "1"
    assert sorted(os.listdir(tmp_path)) == ["out"]

"""End an engine process when the program that started it is gone.

The Slicer module starts each engine child (``cardseg segment``, ``cardseg batch``, ``cardseg
serve``) with the environment variable :data:`PARENT_ENV` set to its own process id. When that
variable is set, :func:`watch_parent_from_env` starts a daemon thread that checks every
:data:`POLL_S` seconds whether that process still runs; once it is gone (Slicer exited or crashed),
the engine is stopped as by SIGTERM (every command cleans up as after Ctrl-C) and, should it not
have ended :data:`GRACE_S` seconds later (the main thread inside a long native call), it is ended
at once. Without the variable nothing is watched (a user's own command line).

The check never sends a signal to the watched process: on POSIX ``os.kill(pid, 0)`` only asks
whether it exists; on Windows (where ``os.kill`` would terminate it) a handle opened with
``SYNCHRONIZE`` rights is waited on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Optional

from cardseg.base.input_watch import stop_self

#: the environment variable naming the process id of the program the engine must not outlive
PARENT_ENV = "CARDSEG_PARENT_PID"
#: seconds between two checks of the watched process
POLL_S = 0.5
#: seconds from the SIGTERM-like stop to the hard exit when the engine has not ended by then
GRACE_S = 2.0
#: the exit status of a hard exit after the parent left (128 + SIGTERM, as a shell reports it)
EXIT_PARENT_GONE = 128 + int(signal.SIGTERM)


def parent_pid_from_env(environ=None) -> Optional[int]:
    """The watched process id from :data:`PARENT_ENV`, or None (unset, not a positive integer)."""
    text = (os.environ if environ is None else environ).get(PARENT_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _posix_alive(pid: int) -> Callable[[], bool]:
    def alive() -> bool:
        try:
            os.kill(pid, 0)  # signal 0: no signal is sent, only the existence is checked
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by another user
            return True
        except OSError:
            return False
        return True

    return alive


def _windows_alive(pid: int) -> Callable[[], bool]:
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    synchronize, wait_timeout = 0x00100000, 0x00000102
    handle = kernel32.OpenProcess(synchronize, False, int(pid))

    def alive() -> bool:
        return bool(handle) and kernel32.WaitForSingleObject(handle, 0) == wait_timeout

    return alive


def alive_check(pid: int) -> Callable[[], bool]:
    """A function telling whether process ``pid`` still runs (opened now: a later reuse of the id
    on Windows is not mistaken for it)."""
    return _windows_alive(pid) if sys.platform == "win32" else _posix_alive(pid)


def _stop_self() -> None:
    """Stop as SIGTERM stops a command, ending the process :data:`GRACE_S` seconds later if it
    still runs (:func:`cardseg.base.input_watch.stop_self`)."""
    stop_self(GRACE_S)


def watch_parent(
    pid: int,
    on_gone: Callable[[], None] = _stop_self,
    poll_s: float = POLL_S,
    alive: Optional[Callable[[], bool]] = None,
) -> threading.Thread:
    """Start the daemon thread that calls ``on_gone()`` once process ``pid`` no longer runs."""
    check = alive or alive_check(pid)

    def run() -> None:
        stop = threading.Event()
        while check():
            stop.wait(poll_s)
        on_gone()

    thread = threading.Thread(target=run, name="cardseg-parent-watch", daemon=True)
    thread.start()
    return thread


def watch_parent_from_env(environ=None) -> Optional[threading.Thread]:
    """:func:`watch_parent` on the process :data:`PARENT_ENV` names; None when it names none."""
    pid = parent_pid_from_env(environ)
    return watch_parent(pid) if pid is not None else None

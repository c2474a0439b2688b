"""Progress reporting: a tqdm bar, JSON lines for the Slicer module, or nothing.

Every write holds :data:`cardseg.base.fd2.FD2_LOCK`: while another thread points file descriptor
2 elsewhere (to catch what SimpleITK prints while it writes a volume), a progress line waits for
it to come back instead of landing in that capture (which would print it later, out of order,
where the Slicer module reads one JSON object per line).
"""

from __future__ import annotations

import json
import sys
from typing import Optional

from cardseg.base.fd2 import FD2_LOCK


class Progress:
    """Base reporter: ``stage(name, total)`` opens a stage, ``advance(n)`` moves it, ``close()``."""

    def stage(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class JsonProgress(Progress):
    """One JSON object per line on a stream: ``{"stage": ..., "done": n, "total": m}``."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.name, self.done, self.total = "", 0, 0

    def _emit(self) -> None:
        line = json.dumps({"stage": self.name, "done": self.done, "total": self.total}) + "\n"
        with FD2_LOCK:
            self.stream.write(line)
            self.stream.flush()

    def stage(self, name: str, total: int) -> None:
        self.name, self.done, self.total = name, 0, int(total)
        self._emit()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._emit()


class TqdmProgress(Progress):
    """A tqdm bar per stage on stderr."""

    def __init__(self):
        self.bar: Optional[object] = None

    def stage(self, name: str, total: int) -> None:
        from tqdm.auto import tqdm

        self.close()
        with FD2_LOCK:
            self.bar = tqdm(total=total, desc=name, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            with FD2_LOCK:
                self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            with FD2_LOCK:
                self.bar.close()
            self.bar = None


def make_progress(kind: str = "bar", quiet: bool = False) -> Progress:
    if kind == "json":
        return JsonProgress()
    if quiet or kind == "none":
        return Progress()
    return TqdmProgress()

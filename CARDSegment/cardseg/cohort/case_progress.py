"""Progress over a batch's cases: a tqdm bar with ETA and cases/min, JSON lines, or nothing."""

from __future__ import annotations

import sys
import time


class CaseProgress:
    """A tqdm bar over cases with ETA and cases/min (``bar``), JSON lines (``json``) or nothing."""

    def __init__(self, kind: str = "bar", quiet: bool = False):
        self.kind = "none" if (quiet and kind != "json") else kind
        self.bar = None
        self.json = None
        self.t0 = time.perf_counter()
        self.failed = 0
        if self.kind == "json":
            from cardseg.base.progress import JsonProgress

            self.json = JsonProgress()

    def start(self, total: int, stage: str = "cases", leave: bool = True) -> None:
        self.close()
        self.t0 = time.perf_counter()
        self.failed = 0
        if self.kind == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total,
                desc=stage,
                unit="case",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=leave,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
            )
        elif self.json is not None:
            self.json.stage(stage, total)

    def advance(self, ok: bool = True) -> None:
        self.failed += 0 if ok else 1
        if self.bar is not None:
            self.bar.update(1)
            minutes = (time.perf_counter() - self.t0) / 60.0
            rate = self.bar.n / minutes if minutes > 0 else 0.0
            self.bar.set_postfix_str(
                f"{rate:.1f} cases/min" + (f", {self.failed} failed" if self.failed else ""), refresh=True
            )
        elif self.json is not None:
            self.json.advance(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

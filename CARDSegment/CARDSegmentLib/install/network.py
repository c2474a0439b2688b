"""Whether this computer can reach the package index that pip downloads from (no Qt, no Slicer).

The installer asks this before it asks the user anything, so that a computer without a network
connection gets one plain sentence instead of pip's failure. The index is the one pip would use:
``PIP_INDEX_URL`` when set, PyPI otherwise. Only an index over HTTP(S) is probed; with
``PIP_NO_INDEX`` or a local index (``file://``) the answer is always "reachable", because pip
needs no network there. Proxies set in the environment (``HTTPS_PROXY``) are used, as pip uses them.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Mapping, Optional
from urllib.parse import urlsplit

#: the index pip uses when nothing else is configured
DEFAULT_INDEX = "https://pypi.org/simple/"
#: how long the probe waits for an answer (seconds); a computer without a network fails at once
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class IndexProbe:
    """What was asked and the answer: ``reachable`` is False only when no connection could be made."""

    url: str
    reachable: bool

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or self.url


def package_index(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The index URL pip downloads from, or None when pip needs no network (``PIP_NO_INDEX``)."""
    if environ.get("PIP_NO_INDEX", "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    return environ.get("PIP_INDEX_URL", "").strip() or DEFAULT_INDEX


def probe_index(
    url: Optional[str], timeout: float = PROBE_TIMEOUT_S, opener: Callable = urllib.request.urlopen
) -> IndexProbe:
    """Ask ``url`` for its headers. Any HTTP answer counts as reachable (a proxy's refusal, too:
    the network is there); no name resolution, a refused or timed-out connection do not. URLs that
    are not HTTP(S), and None, are reachable without asking."""
    if url is None or urlsplit(url).scheme not in ("http", "https"):
        return IndexProbe(url or "", True)
    try:
        with opener(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return IndexProbe(url, True)
    except urllib.error.HTTPError:
        return IndexProbe(url, True)
    except (urllib.error.URLError, OSError):
        return IndexProbe(url, False)


def offline_sentence(probe: IndexProbe, what: str) -> str:
    """The one sentence the panel shows when ``what`` cannot be downloaded."""
    return (
        f"CARDSegment must download {what} from the internet, but {probe.host} cannot be reached: "
        "connect this computer to a network and click 'Segment & Calibrate' again."
    )

"""The research-only acknowledgement: before the first run with weights trained on a
research-licensed data set (the shipped ``acdc`` bundle was trained on ACDC), the user is told
what that means and agrees once; the answer is kept in the application settings.

No Qt here: ``settings`` is anything with ``value(key)`` and ``setValue(key, value)`` (Slicer's
``qt.QSettings()``, a test's dictionary-backed stub) and ``ask(title, text) -> bool`` shows the
question (Slicer: ``slicer.util.confirmOkCancelDisplay``). Declining stores nothing, so the
question comes again on the next run; agreeing stores :data:`ACKNOWLEDGEMENT_VERSION`, and a
later change of the terms (a new version) asks again.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Mapping, Optional

from .bundles import bundle_config, shipped_bundle_dir

#: where the answer is kept (Slicer's application settings)
SETTINGS_KEY = "CARDSegment/ResearchUseAcknowledged"
#: the version of the terms below; raise it when they change, so that everyone is asked again
ACKNOWLEDGEMENT_VERSION = "1"
TITLE = "CARDSegment: research use only"

#: training data sets released for research use only, by the lower-case name a bundle's
#: provenance gives (``provenance.training.<role>.data``), with the reference to cite
RESEARCH_ONLY_DATA: Dict[str, str] = {
    "acdc": "ACDC (Bernard et al., IEEE Transactions on Medical Imaging 37(11), 2018)",
}


def research_only_sources(config: Mapping, shipped: bool = False) -> List[str]:
    """The research-only data sets a bundle's networks were trained on, as references to cite.

    config: the bundle's ``bundle.json`` as a dictionary. The shipped default bundle counts as
    ACDC-trained whatever its provenance says (its model card says so). A provenance that is not an
    object (or names no training data) names no data set.
    """
    found: List[str] = []
    provenance = config.get("provenance")
    training = provenance.get("training") if isinstance(provenance, Mapping) else None
    for role in sorted(training) if isinstance(training, Mapping) else ():
        entry = training[role]
        data = str(entry.get("data", "")) if isinstance(entry, Mapping) else ""
        for name, reference in RESEARCH_ONLY_DATA.items():
            if name in data.lower() and reference not in found:
                found.append(reference)
    if shipped and RESEARCH_ONLY_DATA["acdc"] not in found:
        found.insert(0, RESEARCH_ONLY_DATA["acdc"])
    return found


def acknowledgement_text(sources: List[str]) -> str:
    """The question shown once, naming the data sets the weights were trained on."""
    return (
        "The model weights you are about to use were trained on " + " and ".join(sources) + ", which "
        "is released for research use only. The weights inherit that restriction:\n\n"
        "- use them for research only, not for clinical decisions (CARDSegment is not a medical device);\n"
        "- cite the data set when you publish results made with them.\n\n"
        "The CARDSegment code itself is under the Apache-2.0 licence; nothing leaves this computer.\n\n"
        "Click OK to agree (you will not be asked again), or Cancel to stop this run."
    )


def is_acknowledged(settings) -> bool:
    """Whether the user has agreed to the current terms."""
    return str(settings.value(SETTINGS_KEY) or "") == ACKNOWLEDGEMENT_VERSION


def record_acknowledgement(settings) -> None:
    settings.setValue(SETTINGS_KEY, ACKNOWLEDGEMENT_VERSION)


def ensure_acknowledged(config: Mapping, settings, ask: Callable[[str, str], bool], shipped: bool = False) -> bool:
    """True when the run may go on: the bundle needs no acknowledgement, the user agreed before,
    or agrees now (then the answer is stored). False: the user declined; nothing is stored."""
    sources = research_only_sources(config, shipped=shipped)
    if not sources or is_acknowledged(settings):
        return True
    if not ask(TITLE, acknowledgement_text(sources)):
        return False
    record_acknowledgement(settings)
    return True


def ensure_acknowledged_for_bundle(
    bundle_path: Optional[os.PathLike], module_dir: os.PathLike, settings, ask: Callable[[str, str], bool]
) -> bool:
    """:func:`ensure_acknowledged` for the bundle a run will use: ``bundle_path`` (a
    :class:`~CARDSegmentLib.runs.jobs.JobOptions`' ``bundle_path``; None means the shipped default) read from its
    ``bundle.json`` (a :class:`~.bundles.BundleChoiceError` when it cannot be read)."""
    shipped_dir = os.path.realpath(shipped_bundle_dir(module_dir))
    path = shipped_dir if bundle_path is None else os.path.realpath(bundle_path)
    return ensure_acknowledged(bundle_config(path), settings, ask, shipped=(path == shipped_dir))

"""The panel's choices (bundle, device, method, fast review, overlay, a sequence's frames) and the run options.

Plain enums, saved in the scene by the module's parameter node (``CARDSegmentParameterNode`` in
``CARDSegment.py``, which binds them to the GUI); :func:`job_options` reads such a node.
"""

from __future__ import annotations

import enum

from ..install.bundles import resolve_bundle
from ..runs.jobs import JobOptions
from ..cine.sequences import FrameMode  # noqa: F401 - the panel's frame choice, with the other enums here

#: the review map of "Fast review": the bundle's rule on the TAC alone (cardseg.bundle.review_rules), no flipped runs
FAST_REVIEW_MAP = "tac"


class BundleSource(enum.Enum):
    SHIPPED = "shipped"
    FOLDER = "folder"

    def label(self):
        return {"shipped": "Shipped default (ACDC)", "folder": "Bundle folder"}[self.value]


class Device(enum.Enum):
    AUTO = "auto"
    GPU = "cuda"
    CPU = "cpu"

    def label(self):
        return {"auto": "Automatic", "cuda": "GPU (CUDA)", "cpu": "CPU"}[self.value]


class Method(enum.Enum):
    CARD = "card"
    UNCALIBRATED = "uc"

    def label(self):
        return {"card": "CARD (calibrated)", "uc": "Uncalibrated (primary only)"}[self.value]


class Overlay(enum.Enum):
    DISAGREEMENT = "disagreement"
    TEMPERATURE = "temperature"
    NONE = "none"

    def label(self):
        return {"disagreement": "Disagreement", "temperature": "Temperature", "none": "None"}[self.value]


def bundle_path(parameter_node, module_dir: str) -> str:
    """The bundle folder the parameters choose (raises ``BundleChoiceError`` when unusable)."""
    return str(
        resolve_bundle(parameter_node.bundleSource == BundleSource.SHIPPED, parameter_node.bundleFolder, module_dir)
    )


def job_options(parameter_node, module_dir: str) -> JobOptions:
    """The options of one run from the panel's parameters; the engine ships in ``module_dir``."""
    return JobOptions(
        bundle_path=bundle_path(parameter_node, module_dir),
        device=parameter_node.device.value,
        method=parameter_node.method.value,
        review_map=FAST_REVIEW_MAP if parameter_node.fastReview and parameter_node.method == Method.CARD else None,
        load_probabilities=parameter_node.loadProbabilities,
        overlay=parameter_node.overlay.value,
        opacity=parameter_node.overlayOpacity,
        engine_dir=module_dir,
        frame_mode=parameter_node.frameMode.value,
        ed_frame=int(parameter_node.edFrame),
        es_frame=int(parameter_node.esFrame),
    )

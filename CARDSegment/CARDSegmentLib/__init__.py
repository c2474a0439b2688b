"""CARDSegmentLib: the MRML side of the CARDSegment module (no Qt, no ScriptedLoadableModule).

Five packages, arrows pointing down:

* :mod:`.panel` — the panel's decisions, its choices, the module's Logic and self-test (the top);
* :mod:`.cine` — a cine sequence behind the input, one run over its frames, results recorded as
  sequences, the cardiac indices;
* :mod:`.runs` — jobs and the engine process: one-shot and warm ``cardseg`` children, their
  progress, errors and cancel;
* :mod:`.outputs` — an output folder as nodes on the input's geometry, overlays, the flagged-region
  review and its export;
* :mod:`.install` — packages, bundle choice, the weights' acknowledgement, sample data.

``runs`` uses ``outputs`` and ``install``; ``cine`` uses those three; ``panel`` uses them all.
Everything here runs in Slicer and under the PyPI ``slicer-core`` package (real MRML, no GUI);
:mod:`.install.packages` alone calls ``slicer.util``'s dialogs and pip, which tests replace.
"""

from .install.bundles import (
    BundleChoiceError,
    bundle_classes,
    bundle_config,
    bundle_label,
    folder_text,
    resolve_bundle,
    shipped_bundle_dir,
)
from .install.dependencies import REQUIREMENTS, Requirement, missing_requirements
from .runs.jobs import JobMonitor, JobOptions, SegmentationJob, engine_dir_of, one_line
from .outputs.loading import load_outputs
from .outputs.nodes import ROLE_ATTRIBUTE, OutputError, OutputNodes, find_outputs, release_outputs, remove_outputs
from .outputs.overlays import OVERLAY_CHOICES, set_overlay_opacity, show_overlay
from .cine.job import CineJob
from .cine.results import export_cine_review, indices_lines, read_indices
from .panel.gui import (
    ClickGuard,
    connect_gui,
    default_input,
    elapsed_text,
    fill_region_table,
    region_table,
    safe_file_name,
    show_cine_choices,
    watched_nodes_gone,
)
from .runs.process import (
    CANCELLED,
    FAILED,
    IDLE,
    RUNNING,
    SUCCEEDED,
    CardsegRun,
    Progress,
    SegmentCommand,
    extract_error,
    parse_progress_line,
)
from .outputs.review import (
    STATUSES,
    export_review,
    has_decisions,
    review_counts,
    review_rows,
    set_region_status,
    show_region,
)
from .cine.sequences import AUTO, Cine, FrameMode, FramePlan, cine_of, frame_plan, pick_ed_es
from .panel.summary import Summary, agreement_summary
from .outputs.terminology import register_module_terminology

__all__ = [
    "BundleChoiceError",
    "bundle_classes",
    "bundle_config",
    "bundle_label",
    "folder_text",
    "resolve_bundle",
    "shipped_bundle_dir",
    "REQUIREMENTS",
    "Requirement",
    "missing_requirements",
    "JobMonitor",
    "JobOptions",
    "SegmentationJob",
    "engine_dir_of",
    "one_line",
    "OVERLAY_CHOICES",
    "ROLE_ATTRIBUTE",
    "OutputError",
    "OutputNodes",
    "Summary",
    "agreement_summary",
    "find_outputs",
    "load_outputs",
    "release_outputs",
    "remove_outputs",
    "set_overlay_opacity",
    "show_overlay",
    "CANCELLED",
    "FAILED",
    "IDLE",
    "RUNNING",
    "SUCCEEDED",
    "CardsegRun",
    "Progress",
    "SegmentCommand",
    "extract_error",
    "parse_progress_line",
    "ClickGuard",
    "connect_gui",
    "default_input",
    "elapsed_text",
    "safe_file_name",
    "watched_nodes_gone",
    "fill_region_table",
    "region_table",
    "show_cine_choices",
    "CineJob",
    "export_cine_review",
    "indices_lines",
    "read_indices",
    "AUTO",
    "Cine",
    "FrameMode",
    "FramePlan",
    "cine_of",
    "frame_plan",
    "pick_ed_es",
    "STATUSES",
    "export_review",
    "has_decisions",
    "review_counts",
    "review_rows",
    "set_region_status",
    "show_region",
    "register_module_terminology",
]

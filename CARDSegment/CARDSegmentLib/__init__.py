"""CARDSegmentLib: the MRML side of the CARDSegment module (no Qt, no ScriptedLoadableModule).

* :mod:`.process` — build and run ``cardseg segment`` in a separate process, read its progress
  lines and its one-line error (any launcher: a real subprocess or a test's fake).
* :mod:`.jobs` — one "Segment & Calibrate": input to temporary file, process, outputs to nodes;
  :class:`~.jobs.JobMonitor` drives it from the panel's timer and turns any error into one line.
* :mod:`.nodes` — outputs to nodes on the input's exact geometry, overlays, replacing earlier
  outputs, the agreement summary.
* :mod:`.review` — the flagged-region review table, ROI outline, export.
* :mod:`.colormaps`, :mod:`.bundles`, :mod:`.dependencies` — colour maps, bundle choice, packages.

Everything here runs in Slicer and under the PyPI ``slicer-core`` package (real MRML, no GUI).
"""

from .bundles import (BundleChoiceError, bundle_classes, bundle_config, bundle_label, folder_text, resolve_bundle,
                      shipped_bundle_dir)
from .dependencies import REQUIREMENTS, Requirement, missing_requirements
from .jobs import JobMonitor, JobOptions, SegmentationJob, engine_dir_of, one_line
from .nodes import (OVERLAY_CHOICES, ROLE_ATTRIBUTE, OutputError, OutputNodes, Summary, agreement_summary,
                    find_outputs, load_outputs, release_outputs, remove_outputs, set_overlay_opacity, show_overlay)
from .process import (CANCELLED, FAILED, IDLE, RUNNING, SUCCEEDED, CardsegRun, Progress, SegmentCommand,
                      extract_error, parse_progress_line)
from .review import STATUSES, export_review, has_decisions, review_counts, review_rows, set_region_status, show_region

__all__ = [
    "BundleChoiceError", "bundle_classes", "bundle_config", "bundle_label", "folder_text", "resolve_bundle",
    "shipped_bundle_dir",
    "REQUIREMENTS", "Requirement", "missing_requirements",
    "JobMonitor", "JobOptions", "SegmentationJob", "engine_dir_of", "one_line",
    "OVERLAY_CHOICES", "ROLE_ATTRIBUTE", "OutputError", "OutputNodes", "Summary", "agreement_summary",
    "find_outputs", "load_outputs", "release_outputs", "remove_outputs", "set_overlay_opacity", "show_overlay",
    "CANCELLED", "FAILED", "IDLE", "RUNNING", "SUCCEEDED", "CardsegRun", "Progress", "SegmentCommand",
    "extract_error", "parse_progress_line",
    "STATUSES", "export_review", "has_decisions", "review_counts", "review_rows", "set_region_status",
    "show_region",
]

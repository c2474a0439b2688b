"""CARDSegmentLib: the MRML side of the CARDSegment module (no Qt, no ScriptedLoadableModule).

* :mod:`.process` — build and run ``cardseg segment`` in a separate process, read its progress
  lines and its one-line error (any launcher: a real subprocess or a test's fake), the stages'
  places on the progress bar in :mod:`.stages`;
  :mod:`.engine` — the same runs through one warm ``cardseg serve`` process kept between clicks
  (restarted after a crash, killed on cancel; the one-shot process is its fallback).
* :mod:`.jobs` — one "Segment & Calibrate": input to temporary file, process, outputs to nodes;
  :class:`~.jobs.JobMonitor` drives it from the panel's timer and turns any error into one line.
* :mod:`.loading` — one output folder to nodes on the input's exact geometry, replacing earlier
  outputs; below it :mod:`.outputs` (roles, finding, releasing, removing this module's nodes),
  :mod:`.geometry`, :mod:`.volume_files`, :mod:`.terminology`.
* :mod:`.overlays` — the disagreement and temperature maps in the slice views; :mod:`.views`.
* :mod:`.review` — the flagged-region review table, the selected region's highlight, export;
  :mod:`.region_outlines` — the regions' own voxels as an outlined segmentation.
* :mod:`.sequences` — a cine sequence behind the input (browser, frames), which frames to
  segment, the ED/ES rule; :mod:`.cine` — one run over a sequence's frames (``cardseg batch``,
  loaded a frame at a time); :mod:`.cine_results` — the cardiac indices the engine wrote, shown
  and exported with every frame's review.
* :mod:`.summary` — the agreement score in words.
* :mod:`.panel` — the panel's decisions without Qt (GUI binding, default input, removed nodes,
  double clicks, export file names, elapsed time).
* :mod:`.colormaps`, :mod:`.bundles`, :mod:`.dependencies` — colour maps, bundle choice, packages.
* For the module file (``CARDSegment.py``): :mod:`.about` (help and acknowledgement texts),
  :mod:`.parameters` (the panel's choices, job options),
  :mod:`.install` (installing the packages in Slicer, after asking), :mod:`.module_logic` (the
  Logic without Qt: runs polled by a timer it is given, results shown, reviewed, exported),
  :mod:`.selftest` (the self-test's steps).

Arrows point down: ``outputs`` is the bottom; ``geometry``, ``volume_files``, ``terminology``,
``views`` sit on it; ``overlays`` and ``review`` on those; ``loading`` on them; ``jobs`` on
``loading`` and ``process``; the module-file helpers on top.

Everything here runs in Slicer and under the PyPI ``slicer-core`` package (real MRML, no GUI);
:mod:`.install` alone calls ``slicer.util``'s dialogs and pip, which tests replace.
"""

from .bundles import (
    BundleChoiceError,
    bundle_classes,
    bundle_config,
    bundle_label,
    folder_text,
    resolve_bundle,
    shipped_bundle_dir,
)
from .dependencies import REQUIREMENTS, Requirement, missing_requirements
from .jobs import JobMonitor, JobOptions, SegmentationJob, engine_dir_of, one_line
from .loading import load_outputs
from .outputs import ROLE_ATTRIBUTE, OutputError, OutputNodes, find_outputs, release_outputs, remove_outputs
from .overlays import OVERLAY_CHOICES, set_overlay_opacity, show_overlay
from .cine import CineJob
from .cine_results import export_cine_review, indices_lines, read_indices
from .panel import (
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
from .process import (
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
from .review import STATUSES, export_review, has_decisions, review_counts, review_rows, set_region_status, show_region
from .sequences import AUTO, Cine, FrameMode, FramePlan, cine_of, frame_plan, pick_ed_es
from .summary import Summary, agreement_summary
from .terminology import register_module_terminology

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

"""One cine from a study's short-axis series of one slice each. MRML classes only (no Qt).

Many scanners export a short-axis cine as one series per slice location; Slicer then loads each as
a sequence of single-slice volumes. :func:`study_series` finds, for the panel's input, the
single-slice volume sequences of its study (the same subject-hierarchy parent, when the scene has
one); :func:`plan_stack` checks that they make one stack (the same frame count, orientation and
in-plane grid, distinct and evenly spaced positions along the slice normal) or says in one line
which series disagree; :func:`combine_series` builds the cine: a sequence of 3-D volumes, frame t
holding every series' frame t, slices sorted along the normal, the slice spacing from their
positions, with a browser and a proxy volume as the DICOM plugin makes them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..outputs.geometry import ijk_to_ras, image_dimensions, vtk_matrix
from ..outputs.nodes import ROLE_ATTRIBUTE, all_nodes
from .sequences import cine_of, sequences_logic

#: positions (mm) and direction cosines closer than this count as equal
POSITION_TOLERANCE_MM = 0.01
DIRECTION_TOLERANCE = 1e-3
#: how far (as a fraction of the smallest gap) a gap between neighbouring slices may differ from it
GAP_TOLERANCE = 0.05


class StackError(ValueError):
    """The series cannot make one stack (one line saying which series and why)."""


@dataclass(frozen=True)
class SliceSeries:
    """A single-slice volume sequence: its frames' grid (I, J), IJK-to-RAS matrix and slice position."""

    sequence: object
    name: str
    frames: int
    grid: Tuple[int, int]
    matrix: np.ndarray  # 4 x 4, of the first frame

    @property
    def spacing(self) -> np.ndarray:
        return np.linalg.norm(self.matrix[:3, :2], axis=0)

    @property
    def directions(self) -> np.ndarray:
        """The unit row (I) and column (J) directions, 3 x 2."""
        return self.matrix[:3, :2] / self.spacing

    @property
    def normal(self) -> np.ndarray:
        n = np.cross(self.directions[:, 0], self.directions[:, 1])
        return n / np.linalg.norm(n)

    @property
    def origin(self) -> np.ndarray:
        return self.matrix[:3, 3]


@dataclass(frozen=True)
class StackPlan:
    """Series sorted along the normal, the slice spacing (mm) and the frame count."""

    series: Tuple[SliceSeries, ...]
    gap_mm: float
    frames: int

    @property
    def names(self) -> List[str]:
        return [s.name for s in self.series]


def slice_series_of(sequence) -> Optional[SliceSeries]:
    """``sequence`` as a :class:`SliceSeries` when it is a sequence of two or more single-slice
    scalar volumes (and no result of this module), else None."""
    count = int(sequence.GetNumberOfDataNodes())
    if count < 2 or sequence.GetAttribute(ROLE_ATTRIBUTE) is not None:
        return None
    import slicer

    first = sequence.GetNthDataNode(0)
    if not isinstance(first, slicer.vtkMRMLScalarVolumeNode) or isinstance(first, slicer.vtkMRMLLabelMapVolumeNode):
        return None
    dims = image_dimensions(first)
    if not dims or dims[2] != 1:
        return None
    return SliceSeries(sequence, sequence.GetName() or sequence.GetID(), count, (dims[0], dims[1]), ijk_to_ras(first))


def _study_of(scene, node) -> Optional[int]:
    """The subject-hierarchy parent item of ``node`` (its study, for a DICOM series), or None."""
    import slicer

    hierarchy = slicer.vtkMRMLSubjectHierarchyNode.GetSubjectHierarchyNode(scene)
    if hierarchy is None:
        return None
    item = hierarchy.GetItemByDataNode(node)
    return hierarchy.GetItemParent(item) if item else None


def study_series(scene, input_volume) -> List[SliceSeries]:
    """The single-slice sequences of the input's study when the input shows one (its own first),
    else none. Series in a subject hierarchy count only under the input's parent item."""
    cine = cine_of(scene, input_volume)
    own = slice_series_of(cine.sequence) if cine is not None else None
    if own is None:
        return []
    import slicer

    study = _study_of(scene, own.sequence)
    out = [own]
    for node in all_nodes(scene):
        if isinstance(node, slicer.vtkMRMLSequenceNode) and node.GetID() != own.sequence.GetID():
            series = slice_series_of(node)
            if series is not None and _study_of(scene, node) == study:
                out.append(series)
    return out


def _names(series: Sequence[SliceSeries]) -> str:
    return ", ".join(f"'{s.name}'" for s in series)


def _check_frames(series: Sequence[SliceSeries]) -> int:
    counts = Counter(s.frames for s in series)
    common = max(counts, key=lambda n: (counts[n], n == series[0].frames))
    odd = [s for s in series if s.frames != common]
    if odd:
        detail = ", ".join(f"'{s.name}' has {s.frames}" for s in odd)
        raise StackError(f"the series differ in frame count: {detail}, the others {common} frames")
    return common


def _check_geometry(series: Sequence[SliceSeries]) -> None:
    ref = series[0]
    turned = [s for s in series[1:] if np.abs(s.directions - ref.directions).max() > DIRECTION_TOLERANCE]
    if turned:
        raise StackError(f"{_names(turned)} lie in another orientation than '{ref.name}'")
    other = [
        s for s in series[1:] if s.grid != ref.grid or np.abs(s.spacing - ref.spacing).max() > POSITION_TOLERANCE_MM
    ]
    if other:
        grid = f"{ref.grid[0]} x {ref.grid[1]} pixels of {ref.spacing[0]:.3g} x {ref.spacing[1]:.3g} mm"
        raise StackError(f"{_names(other)} are on another in-plane grid than '{ref.name}' ({grid})")
    shifted = [s for s in series[1:] if _in_plane_offset(s, ref) > POSITION_TOLERANCE_MM * 10]
    if shifted:
        raise StackError(f"{_names(shifted)} are shifted within the slice plane against '{ref.name}'")


def _in_plane_offset(s: SliceSeries, ref: SliceSeries) -> float:
    d = s.origin - ref.origin
    return float(np.linalg.norm(d - np.dot(d, ref.normal) * ref.normal))


def _check_positions(series: Sequence[SliceSeries]) -> Tuple[Tuple[SliceSeries, ...], float]:
    normal = series[0].normal
    ordered = sorted(series, key=lambda s: float(np.dot(s.origin, normal)))
    positions = np.array([float(np.dot(s.origin, normal)) for s in ordered])
    gaps = np.diff(positions)
    same = [(ordered[i], ordered[i + 1]) for i, g in enumerate(gaps) if g < POSITION_TOLERANCE_MM]
    if same:
        a, b = same[0]
        raise StackError(f"'{a.name}' and '{b.name}' are at the same slice position ({positions[0]:.1f} mm)")
    gap = float(gaps.min())  # a missing slice location leaves a gap of twice the step or more
    uneven = [i for i, g in enumerate(gaps) if abs(g - gap) > GAP_TOLERANCE * gap]
    if uneven:
        i = uneven[0]
        raise StackError(
            f"the slices are not evenly spaced: {gaps[i]:.1f} mm between '{ordered[i].name}' and "
            f"'{ordered[i + 1].name}', {gap:.1f} mm elsewhere (a slice location missing?)"
        )
    return tuple(ordered), gap


def plan_stack(series: Sequence[SliceSeries]) -> StackPlan:
    """Check that ``series`` make one stack (the first is the reference); raises :class:`StackError`."""
    if len(series) < 2:
        raise StackError("a stack needs at least two single-slice series of the same study")
    frames = _check_frames(series)
    _check_geometry(series)
    ordered, gap = _check_positions(series)
    return StackPlan(ordered, gap, frames)


def _frame_array(series: SliceSeries, frame: int) -> np.ndarray:
    from vtkmodules.util import numpy_support

    image = series.sequence.GetNthDataNode(frame).GetImageData()
    values = numpy_support.vtk_to_numpy(image.GetPointData().GetScalars())
    return values.reshape(series.grid[1], series.grid[0])


def _stacked_volume(plan: StackPlan, frame: int, matrix: np.ndarray):
    """Frame ``frame`` of every series as one 3-D scalar volume node (not in a scene)."""
    import slicer
    import vtk
    from vtkmodules.util import numpy_support

    planes = np.stack([_frame_array(s, frame) for s in plan.series])  # (K, J, I)
    image = vtk.vtkImageData()
    image.SetDimensions(plan.series[0].grid[0], plan.series[0].grid[1], len(plan.series))
    scalars = numpy_support.numpy_to_vtk(np.ascontiguousarray(planes).ravel(), deep=True)
    image.GetPointData().SetScalars(scalars)
    volume = slicer.vtkMRMLScalarVolumeNode()
    volume.SetAndObserveImageData(image)
    volume.SetIJKToRASMatrix(vtk_matrix(matrix))
    return volume


def stack_matrix(plan: StackPlan) -> np.ndarray:
    """The stack's IJK-to-RAS: the first series' in-plane columns, K along the normal by the gap,
    the origin the lowest slice's."""
    first = plan.series[0]
    m = first.matrix.copy()
    m[:3, 2] = first.normal * plan.gap_mm
    m[:3, 3] = first.origin
    return m


@dataclass(frozen=True)
class CombinedCine:
    """The new cine: its sequence, browser and proxy volume (the panel's next input)."""

    sequence: object
    browser: object
    proxy: object
    plan: StackPlan


def combine_series(scene, plan: StackPlan, name: str) -> CombinedCine:
    """The cine of ``plan`` as a new sequence (index name, unit and values those of the first
    series) with its own browser and proxy volume named ``name``."""
    first = plan.series[0].sequence
    sequence = scene.AddNewNodeByClass("vtkMRMLSequenceNode", scene.GenerateUniqueName(name))
    sequence.SetIndexName(first.GetIndexName())
    sequence.SetIndexUnit(first.GetIndexUnit())
    sequence.SetIndexType(first.GetIndexType())
    matrix = stack_matrix(plan)
    for frame in range(plan.frames):
        sequence.SetDataNodeAtValue(_stacked_volume(plan, frame, matrix), first.GetNthIndexValue(frame))
    browser = scene.AddNewNodeByClass("vtkMRMLSequenceBrowserNode", scene.GenerateUniqueName(f"{name} browser"))
    browser.SetAndObserveMasterSequenceNodeID(sequence.GetID())
    sequences_logic(scene).UpdateProxyNodesFromSequences(browser)
    proxy = browser.GetProxyNode(sequence)
    proxy.SetName(sequence.GetName())
    return CombinedCine(sequence, browser, proxy, plan)


def stack_name(series: Sequence[SliceSeries]) -> str:
    """``<the series names' common beginning> (N slices)``, or ``short-axis cine (N slices)``."""
    names = [s.name for s in series]
    prefix = names[0]
    for other in names[1:]:
        while prefix and not other.startswith(prefix):
            prefix = prefix[:-1]
    stem = prefix.strip(" -_:,") if len(prefix.strip(" -_:,")) >= 3 else "short-axis cine"
    return f"{stem} ({len(series)} slices)"


def offer_text(series: Sequence[SliceSeries]) -> str:
    """The panel's offer for :func:`study_series`'s result ("" for fewer than two series)."""
    if len(series) < 2:
        return ""
    return f"Combine the study's {len(series)} single-slice series into one cine"


def combined_text(combined: CombinedCine) -> str:
    """``Combined 3 series into 'SAX (3 slices)': 3 slices 8 mm apart, 4 frames.``"""
    plan = combined.plan
    return (
        f"Combined {len(plan.series)} series into '{combined.sequence.GetName()}': "
        f"{len(plan.series)} slices {plan.gap_mm:.3g} mm apart, {plan.frames} frames."
    )

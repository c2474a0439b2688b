"""Which Slicer, MRML, VTK and Qt API the module uses, and whether every supported Slicer has it.

The module supports Slicer 5.8 and later (5.8 is the oldest with everything it needs; it runs
Python 3.9). ``slicer-core`` on PyPI starts at 5.11, so the check has two halves:

* **against the installed slicer-core** (CI runs these files under every slicer-core release on
  PyPI, the oldest included: ``Testing/run-slicer-compat.sh``): every name the module and
  ``CARDSegmentLib`` use exists there, or sits behind a feature check (``hasattr``/``getattr``, or
  a ``try`` that catches ``AttributeError``);
* **against Slicer 5.8.0's source**, which no wheel carries: the names were looked up once in
  the v5.8.0 tag of Slicer's repository (headers of the declaring classes, ``util.py``,
  ``parameterNodeWrapper``, ``ScriptedLoadableModule.py``) and are listed below. A name the module
  starts to use must be looked up the same way and added, or be feature-checked; with a Slicer
  git checkout, ``SLICER_SOURCE=/path/to/Slicer pytest ...`` repeats the lookup.

Names are collected statically (AST), so nothing of the module is imported here.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Set

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()
import vtk  # noqa: E402  (comes with slicer-core)

MODULE_FILE = MODULE_DIR / "CARDSegment.py"
LIB_DIR = MODULE_DIR / "CARDSegmentLib"
SLICER_5_8 = "v5.8.0"

#: names only the Slicer application has (no slicer-core counterpart), checked in v5.8.0's source:
#: Base/Python/slicer/__init__.py (mrmlScene), parameterNodeWrapper/, ScriptedLoadableModule.py;
#: ``app`` (the qSlicerApplication, its ``startupCompleted()`` signal used by the extension template's
#: sample-data registration) is set by the application's Python start-up in every 5.x
APPLICATION_ONLY = {"mrmlScene", "parameterNodeWrapper", "ScriptedLoadableModule", "app"}

#: Qt names the module uses: Qt 5 API that Slicer 5.8 (Qt 5.15) and later have; a new one is
#: added here after checking it there
QT_NAMES = {
    "QTimer",
    "Qt.UserRole",
    "QTableWidgetItem",
    "QDir.homePath",
    "QFileDialog.getSaveFileName",
    "QApplication.doubleClickInterval",
    "QSettings",
}

#: what Slicer v5.8.0 declares, for every Slicer name the module uses (generated from the v5.8.0
#: tag by :func:`lookup_in_slicer_source`; see the module docstring)
SLICER_5_8_0 = {
    "classes": {
        "vtkMRMLColorLegendDisplayNode",
        "vtkMRMLColorTableNode",
        "vtkMRMLMarkupsROINode",
        "vtkMRMLScalarVolumeNode",
        "vtkMRMLSegmentationNode",
        "vtkMRMLSegmentationStorageNode",
        "vtkMRMLSliceCompositeNode",
        "vtkMRMLSliceNode",
        "vtkMRMLTableNode",
        "vtkMRMLTextNode",
        "vtkMRMLVectorVolumeNode",
        "vtkMRMLVolumeArchetypeStorageNode",
        "vtkSlicerColorLogic",
        "vtkMRMLSequenceBrowserNode",
        "vtkMRMLLabelMapVolumeNode",
        "vtkSlicerSegmentationsModuleLogic",
        "vtkMRMLSequenceNode",
        "vtkSlicerSequencesLogic",
        # a cine's volume curves and wall table (CARDSegmentLib/cine/curves.py) and single-slice series
        # combined (CARDSegmentLib/cine/stack.py), looked up in the v5.8.0 tag with lookup_in_slicer_source
        "vtkMRMLLayoutNode",
        "vtkMRMLPlotChartNode",
        "vtkMRMLPlotSeriesNode",
        "vtkMRMLPlotViewNode",
        "vtkMRMLSubjectHierarchyNode",
        "vtkMRMLTableViewNode",
        "vtkSlicerPlotsLogic",
    },
    "util": {
        "VTKObservationMixin",
        "WaitCursor",
        "childWidgetVariables",
        "confirmOkCancelDisplay",
        "createProgressDialog",
        "errorDisplay",
        "loadUI",
        "loadVolume",
        "mainWindow",
        "pip_install",
        "showStatusMessage",
        "tryWithErrorDisplay",
        "warningDisplay",
    },
    "modules": {
        "ScriptedLoadableModule": {
            "ScriptedLoadableModule",
            "ScriptedLoadableModuleLogic",
            "ScriptedLoadableModuleTest",
            "ScriptedLoadableModuleWidget",
        },
        "parameterNodeWrapper": {
            "Minimum",
            "WithinRange",
            "parameterNodeWrapper",
        },
    },
    "methods": {  # name: the classes that declare it in v5.8.0
        # the scene's batch state (one refresh for a commit of many nodes): vtkMRMLScene.h has had
        # all five since Slicer 4 (read in a Slicer 4 header; the slicer-core releases have them too)
        "BatchProcessState": ["vtkMRMLScene"],
        "EndBatchProcessEvent": ["vtkMRMLScene"],
        "EndState": ["vtkMRMLScene"],
        "IsBatchProcessing": ["vtkMRMLScene"],
        "StartState": ["vtkMRMLScene"],
        # the region outlines (CARDSegmentLib.outputs.region_outlines), looked up in the v5.8.0 tag
        "GetLabelValue": ["vtkSegment"],
        "GetNthSegmentID": ["vtkSegmentation"],
        "GetTag": ["vtkSegment"],
        "ImportLabelmapToSegmentationNode": ["vtkSlicerSegmentationsModuleLogic"],
        "SetSliceIntersectionThickness": ["vtkMRMLDisplayNode"],
        "SetVisibility2DFill": ["vtkMRMLSegmentationDisplayNode"],
        "SetVisibility2DOutline": ["vtkMRMLSegmentationDisplayNode"],
        "SetVisibility3D": ["vtkMRMLDisplayNode"],
        # the selected region's outline highlighted (region_outlines.highlight_region), looked up in v5.8.0
        "SetSegmentOpacity2DOutline": ["vtkMRMLSegmentationDisplayNode"],
        "SetSegmentOverrideColor": ["vtkMRMLSegmentationDisplayNode"],
        "SetSegmentVisibility": ["vtkMRMLSegmentationDisplayNode"],
        "UnsetSegmentOverrideColor": ["vtkMRMLSegmentationDisplayNode"],
        "AddColumn": ["vtkMRMLTableNode"],
        "AddNewNodeByClass": ["vtkMRMLScene"],
        "AddNode": ["vtkMRMLScene"],
        "AutoWindowLevelOff": ["vtkMRMLScalarVolumeDisplayNode"],
        "Clear": ["vtkMRMLMeasurement", "vtkMRMLScene"],
        "CopyOrientation": ["vtkMRMLVolumeNode"],
        "CreateDefaultDisplayNodes": [
            "vtkMRMLDiffusionTensorVolumeNode",
            "vtkMRMLDiffusionWeightedVolumeNode",
            "vtkMRMLDisplayableNode",
            "vtkMRMLLabelMapVolumeNode",
            "vtkMRMLMarkupsFiducialNode",
            "vtkMRMLMarkupsNode",
            "vtkMRMLMarkupsPlaneNode",
            "vtkMRMLMarkupsROINode",
            "vtkMRMLModelNode",
            "vtkMRMLScalarVolumeNode",
            "vtkMRMLSegmentationNode",
            "vtkMRMLTransformNode",
            "vtkMRMLVectorVolumeNode",
        ],
        "EndCloseEvent": ["vtkMRMLScene"],
        "EndModify": ["vtkMRMLMarkupsNode", "vtkMRMLNode"],
        "GenerateUniqueName": ["vtkMRMLScene"],
        "GetApplyThreshold": ["vtkMRMLScalarVolumeDisplayNode"],
        "GetAttribute": ["vtkMRMLNode"],
        "GetDimensions": ["vtkMRMLSliceNode"],
        "GetDisplayNode": [
            "vtkMRMLDisplayableHierarchyNode",
            "vtkMRMLDisplayableNode",
            "vtkMRMLTransformHandleWidget",
            "vtkMRMLTransformHandleWidgetRepresentation",
            "vtkSlicerMarkupsInteractionWidget",
            "vtkSlicerMarkupsInteractionWidgetRepresentation",
        ],
        "GetFirstNodeByClass": ["vtkMRMLScene"],
        "GetFirstNodeByName": ["vtkMRMLScene"],
        "GetForegroundVolumeID": ["vtkMRMLSliceCompositeNode"],
        "GetID": ["vtkMRMLNode"],
        "GetIJKToRASMatrix": ["vtkMRMLVolumeNode", "vtkTeemNRRDWriter"],
        "GetImageData": ["vtkMRMLSliceLayerLogic", "vtkMRMLStreamingVolumeNode", "vtkMRMLVolumeNode"],
        "GetImageToWorldMatrix": ["vtkOrientedImageData"],
        "GetLoadedTerminologyNames": ["vtkSlicerTerminologiesModuleLogic"],
        "GetMTime": ["vtkCapPolyData", "vtkCurveMeasurementsCalculator", "vtkDiffusionTensorGlyph"],
        "GetName": [
            "vtkBinaryLabelmapToClosedSurfaceConversionRule",
            "vtkClosedSurfaceToBinaryLabelmapConversionRule",
            "vtkClosedSurfaceToFractionalLabelmapConversionRule",
            "vtkFractionalLabelmapToClosedSurfaceConversionRule",
            "vtkMRMLMeasurement",
            "vtkMRMLNode",
            "vtkMRMLViewLogic",
            "vtkSegment",
            "vtkSegmentationConversionParameters",
            "vtkSegmentationConverterRule",
            "vtkTagTable",
            "vtkURIHandler",
        ],
        "GetNodeByID": ["vtkMRMLScene"],
        "GetNodeReferenceID": ["vtkMRMLNode"],
        "GetNodes": ["vtkMRMLScene"],
        "GetNodesByClass": ["vtkMRMLScene", "vtkMRMLSceneViewNode"],
        "GetNthSegment": ["vtkSegmentation"],
        "GetNumberOfItems": ["vtkMRMLSequenceBrowserNode", "vtkMRMLSubjectHierarchyNode"],
        "GetNumberOfRows": ["vtkMRMLTableNode"],
        "GetNumberOfSegments": ["vtkSegmentation"],
        "GetParentTransformNode": ["vtkMRMLTransformableNode"],
        "GetRepresentation": ["vtkMRMLAbstractWidget", "vtkMRMLDisplayNode", "vtkSegment"],
        "GetScalarRange": ["vtkMRMLDisplayNode"],
        "GetScene": ["vtkMRMLNode"],
        "GetSegment": ["vtkSegmentation"],
        "GetSegmentation": ["vtkMRMLSegmentationNode", "vtkSegmentationHistory"],
        "GetTable": ["vtkMRMLTableNode"],
        "GetTerminologyEntryTagName": ["vtkSegment"],
        "GetText": ["vtkMRMLAnnotationNode", "vtkMRMLTextNode"],
        "GetTransformNodeID": ["vtkMRMLTransformableNode"],
        "GetTransformToWorld": ["vtkMRMLTransformNode"],
        "GetValue": ["vtkImageFillROI", "vtkMRMLMeasurement", "vtkSegmentationConversionParameters"],
        "GetWindowLevelMax": ["vtkMRMLScalarVolumeDisplayNode"],
        "GetWindowLevelMin": ["vtkMRMLScalarVolumeDisplayNode"],
        "IsClosing": ["vtkMRMLScene"],
        "IsNodeClassRegistered": ["vtkMRMLScene"],
        "IsNodePresent": ["vtkMRMLScene"],
        "JumpSliceByCentering": ["vtkMRMLSliceNode"],
        "LoadTerminologyFromFile": ["vtkSlicerTerminologiesModuleLogic"],
        "Modified": [
            "vtkMRMLAnnotationControlPointsNode",
            "vtkMRMLCommandLineModuleNode",
            "vtkMRMLFolderDisplayNode",
            "vtkMRMLNode",
        ],
        "NodeRemovedEvent": ["vtkMRMLScene"],
        "ReadData": ["vtkMRMLStorageNode"],
        "RemoveAttribute": ["vtkMRMLNode"],
        "RemoveNode": ["vtkMRMLScene"],
        "RemoveNodeReferenceIDs": ["vtkMRMLNode"],
        "SetAndObserveColorNodeID": ["vtkMRMLDisplayNode"],
        "SetAndObserveObjectToNodeMatrix": ["vtkMRMLMarkupsROINode"],
        "SetAndObserveTransformNodeID": ["vtkMRMLTransformableNode"],
        "SetApplyThreshold": ["vtkMRMLScalarVolumeDisplayNode"],
        "SetAttribute": ["vtkMRMLNode", "vtkTeemNRRDWriter"],
        "SetAutoThreshold": ["vtkMRMLScalarVolumeDisplayNode"],
        "SetBackgroundVolumeID": ["vtkMRMLSliceCompositeNode"],
        "SetCenter": [
            "vtkImageRectangularSource",
            "vtkMRMLMarkupsPlaneNode",
            "vtkMRMLMarkupsROINode",
            "vtkMarkupsGlyphSource2D",
        ],
        "SetColor": [
            "vtkMRMLColorTableNode",
            "vtkMRMLDisplayNode",
            "vtkMRMLPlotSeriesNode",
            "vtkMRMLROIListNode",
            "vtkMRMLVolumePropertyNode",
            "vtkMarkupsGlyphSource2D",
            "vtkSegment",
        ],
        "SetColumnDescription": ["vtkMRMLTableNode"],
        "SetColumnTitle": ["vtkMRMLTableNode"],
        "SetFileName": ["vtkITKImageWriter", "vtkMRMLStorageNode", "vtkTeemNRRDWriter"],
        "SetFillOpacity": ["vtkMRMLMarkupsDisplayNode"],
        "SetForegroundOpacity": ["vtkMRMLSliceCompositeNode"],
        "SetForegroundVolumeID": ["vtkMRMLSliceCompositeNode"],
        "SetHandlesInteractive": ["vtkMRMLMarkupsDisplayNode"],
        "SetInterpolate": ["vtkMRMLScalarVolumeDisplayNode"],
        "SetLocked": ["vtkMRMLAnnotationNode", "vtkMRMLMarkupsNode", "vtkMRMLTableNode"],
        "SetName": [
            "vtkMRMLMeasurement",
            "vtkMRMLNode",
            "vtkMRMLUnitNode",
            "vtkMRMLViewLogic",
            "vtkSegment",
            "vtkSegmentationConversionParameters",
            "vtkTagTable",
            "vtkURIHandler",
        ],
        "SetNodeReferenceID": ["vtkMRMLNode"],
        "SetNumberOfColors": ["vtkMRMLColorTableNode"],
        "SetOpacity2DFill": ["vtkMRMLSegmentationDisplayNode"],
        "SetOpacity2DOutline": ["vtkMRMLSegmentationDisplayNode"],
        "SetReferenceImageGeometryParameterFromVolumeNode": ["vtkMRMLSegmentationNode"],
        "SetSelectedColor": ["vtkMRMLDisplayNode", "vtkMRMLROIListNode"],
        "SetSingleFile": ["vtkITKArchetypeImageSeriesReader", "vtkMRMLVolumeArchetypeStorageNode"],
        "SetSize": [
            "vtkImageRectangularSource",
            "vtkMRMLColorLegendDisplayNode",
            "vtkMRMLMarkupsPlaneNode",
            "vtkMRMLMarkupsROINode",
        ],
        "SetTag": ["vtkSegment"],
        "SetText": ["vtkMRMLAnnotationNode", "vtkMRMLTextNode"],
        "SetThreshold": ["vtkMRMLScalarVolumeDisplayNode", "vtkMRMLVolumeRenderingDisplayNode"],
        "SetTitleText": ["vtkMRMLColorLegendDisplayNode"],
        "SetTypeToUser": ["vtkMRMLColorNode"],
        "SetUseColumnTitleAsColumnHeader": ["vtkMRMLTableNode"],
        "SetUseCompression": ["vtkITKImageWriter", "vtkMRMLStorageNode", "vtkTeemNRRDWriter"],
        "SetValue": ["vtkImageFillROI", "vtkMRMLMeasurement", "vtkSegmentationConversionParameters"],
        "SetVisibility": ["vtkMRMLAbstractViewNode", "vtkMRMLDisplayNode", "vtkMRMLROIListNode", "vtkMRMLROINode"],
        "SetWindowLevelMinMax": ["vtkMRMLScalarVolumeDisplayNode"],
        "StartCloseEvent": ["vtkMRMLScene"],
        "StartModify": ["vtkMRMLNode"],
        "WriteData": ["vtkMRMLStorageNode"],
        # a cine sequence's browser and volumes (CARDSegmentLib/cine/sequences.py)
        "GetIndexUnit": ["vtkMRMLSequenceNode"],
        "GetNthDataNode": ["vtkMRMLSequenceNode"],
        "GetNthIndexValue": ["vtkMRMLSequenceNode"],
        "GetNumberOfDataNodes": ["vtkMRMLSequenceNode"],
        "GetProxyNode": ["vtkMRMLSequenceBrowserNode"],
        "GetSelectedItemNumber": ["vtkMRMLSequenceBrowserNode"],
        "GetSynchronizedSequenceNodes": ["vtkMRMLSequenceBrowserNode"],
        "SetSelectedItemNumber": ["vtkMRMLSequenceBrowserNode"],
        # a cine's results recorded as sequences of the input's browser (CARDSegmentLib/cine/sequences.py),
        # looked up in the v5.8.0 tag with lookup_in_slicer_source
        "AddProxyNode": ["vtkMRMLSequenceBrowserNode"],
        "AddSynchronizedSequenceNode": ["vtkMRMLSequenceBrowserNode"],
        "GetDataNodeAtValue": ["vtkMRMLSequenceNode"],
        "GetFirstBrowserNodeForProxyNode": ["vtkSlicerSequencesLogic"],
        "GetIndexName": ["vtkMRMLSequenceNode"],
        "GetIndexType": ["vtkMRMLSequenceNode"],
        "GetItemNumberFromIndexValue": ["vtkMRMLSequenceNode"],
        "GetMasterSequenceNode": ["vtkMRMLSequenceBrowserNode"],
        "GetSequenceNode": ["vtkMRMLSequenceBrowserNode"],
        "MissingItemSetToDefault": ["vtkMRMLSequenceBrowserNode"],
        "RemoveDataNodeAtValue": ["vtkMRMLSequenceNode"],
        "SetDataNodeAtValue": ["vtkMRMLSequenceNode"],
        "SetIndexName": ["vtkMRMLSequenceNode"],
        "SetIndexType": ["vtkMRMLSequenceNode"],
        "SetIndexUnit": ["vtkMRMLSequenceNode"],
        "SetMRMLScene": ["vtkCacheManager", "vtkMRMLAbstractLogic", "vtkMRMLParser"],
        "SetMissingItemMode": ["vtkMRMLSequenceBrowserNode"],
        "SetOverwriteProxyName": ["vtkMRMLSequenceBrowserNode"],
        "SetPlayback": ["vtkMRMLSequenceBrowserNode"],
        "SetRecording": ["vtkMRMLSequenceBrowserNode"],
        "SetSaveChanges": ["vtkMRMLSequenceBrowserNode"],
        "UpdateDataNodeAtValue": ["vtkMRMLSequenceNode"],
        "UpdateProxyNodesFromSequences": ["vtkSlicerSequencesLogic"],
        # a cine's volume curves (plot chart, series, layout) and wall table (CARDSegmentLib/cine/curves.py),
        # looked up in the v5.8.0 tag with lookup_in_slicer_source (v5.10.0 and v5.12.0 declare them too)
        "AddAndObservePlotSeriesNodeID": ["vtkMRMLPlotChartNode"],
        "GetLayoutWithPlot": ["vtkSlicerPlotsLogic"],
        "GetViewArrangement": ["vtkMRMLLayoutNode"],
        "LineStyleNone": ["vtkMRMLPlotSeriesNode"],
        "LineStyleSolid": ["vtkMRMLPlotSeriesNode"],
        "MarkerStyleCircle": ["vtkMRMLPlotSeriesNode"],
        "MarkerStyleNone": ["vtkMRMLPlotSeriesNode"],
        "PlotTypeScatter": ["vtkMRMLPlotSeriesNode"],
        "RemoveAllPlotSeriesNodeIDs": ["vtkMRMLPlotChartNode"],
        "SetAndObserveTable": ["vtkMRMLTableNode"],
        "SetAndObserveTableNodeID": ["vtkMRMLPlotSeriesNode"],
        "SetLabelColumnName": ["vtkMRMLPlotSeriesNode"],
        "SetLegendVisibility": ["vtkMRMLPlotChartNode"],
        "SetLineStyle": ["vtkMRMLPlotSeriesNode"],
        "SetMarkerSize": ["vtkMRMLPlotSeriesNode"],
        "SetMarkerStyle": ["vtkMRMLPlotSeriesNode"],
        "SetPlotChartNodeID": ["vtkMRMLPlotViewNode"],
        "SetPlotType": ["vtkMRMLPlotSeriesNode"],
        "SetTableNodeID": ["vtkMRMLTableViewNode"],
        "SetTitle": ["vtkMRMLPlotChartNode"],
        "SetViewArrangement": ["vtkMRMLLayoutNode"],
        "SetXAxisTitle": ["vtkMRMLPlotChartNode"],
        "SetXColumnName": ["vtkMRMLPlotSeriesNode"],
        "SetYAxisTitle": ["vtkMRMLPlotChartNode"],
        "SetYColumnName": ["vtkMRMLPlotSeriesNode"],
        "SlicerLayoutFourUpPlotTableView": ["vtkMRMLLayoutNode"],
        # single-slice series of a study combined into one cine (CARDSegmentLib/cine/stack.py), looked up
        # in the v5.8.0 tag with lookup_in_slicer_source (SetDimensions: vtkImageData's, named by vtkMRMLSliceNode)
        "GetItemByDataNode": ["vtkMRMLSubjectHierarchyNode"],
        "GetItemParent": ["vtkMRMLSubjectHierarchyNode"],
        "GetSubjectHierarchyNode": ["vtkMRMLSubjectHierarchyNode"],
        "SetAndObserveImageData": ["vtkMRMLStreamingVolumeNode", "vtkMRMLVolumeNode"],
        "SetAndObserveMasterSequenceNodeID": ["vtkMRMLSequenceBrowserNode"],
        "SetDimensions": ["vtkMRMLSliceNode"],
        "SetIJKToRASMatrix": ["vtkMRMLVolumeNode", "vtkTeemNRRDWriter"],
    },
}


# ---------------------------------------------------------------------------------------------
# collecting the names (AST)


def module_sources() -> List[Path]:
    return [MODULE_FILE] + sorted(LIB_DIR.rglob("*.py"))


_CAMEL = re.compile(r"^[A-Z][a-z0-9]+[A-Za-z0-9]*$")  # GetID, SetTag, StartCloseEvent; not SIGKILL
_SLICER_CLASS = re.compile(r"^vtk(MRML|Segment|Slicer|Oriented)[A-Za-z0-9]*$")


def _chain(node: ast.Attribute):
    """``(root, [attr, ...])`` of ``a.b.c``: the root Name's id (None for a call, subscript...)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    attrs.reverse()
    return (node.id if isinstance(node, ast.Name) else None), attrs


def _other_modules(tree: ast.Module) -> Set[str]:
    """Names bound to modules that are not Slicer, Qt or VTK (stdlib, numpy, our own library)."""
    slicerish = {"slicer", "qt", "vtk", "ctk"}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] not in slicerish}
        elif isinstance(node, ast.ImportFrom):
            if node.level or (node.module or "").split(".")[0] not in slicerish:
                names |= {a.asname or a.name for a in node.names}
    return names


def _own_names() -> Set[str]:
    """Classes and functions the module and its library define themselves."""
    own = set()
    for path in module_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                own.add(node.name)
    return own


def _guarded_in(tree: ast.Module) -> Set[str]:
    """Names behind a feature check: hasattr/getattr with the name, or a try that catches AttributeError."""
    guarded = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("hasattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            guarded.add(str(node.args[1].value))
        if isinstance(node, ast.Try) and any(_catches_attribute_error(h) for h in node.handlers):
            for inner in node.body:
                guarded |= {n.attr for n in ast.walk(inner) if isinstance(n, ast.Attribute)}
    return guarded


def _catches_attribute_error(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(getattr(t, "id", None) == "AttributeError" for t in types)


def collect_usage(paths: Iterable[Path] = None) -> Dict[str, Dict[str, Set[str]]]:
    """Every Slicer/VTK/Qt name used, by kind, with the files that use it.

    Kinds: ``slicer`` (``slicer.X``), ``util`` (``slicer.util.X``), ``modules`` (``from
    slicer.M import X``: "M.X"), ``classes`` (MRML/segmentation/Slicer VTK classes, also as strings),
    ``class_methods`` ("vtkClass.Method"), ``methods`` (VTK-style calls on any object), ``vtk``
    (``vtk.X``), ``qt`` (``qt.X``), ``guarded`` (names behind a feature check).
    """
    usage: Dict[str, Dict[str, Set[str]]] = defaultdict(lambda: defaultdict(set))
    own = _own_names()
    for path in paths or module_sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        others = _other_modules(tree)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

        def add(kind, name):
            usage[kind][name].add(path.name)

        for name in _guarded_in(tree):
            add("guarded", name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "slicer" and not node.level:
                for alias in node.names:
                    if node.module == "slicer":
                        _add_slicer_attr(add, [alias.name])
                    elif node.module == "slicer.util":
                        add("util", alias.name)
                    else:
                        add("modules", f"{node.module.split('.', 1)[1]}.{alias.name}")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _SLICER_CLASS.match(node.value)
                and not isinstance(parents.get(node), ast.JoinedStr)
            ):
                add("classes", node.value)
            elif isinstance(node, ast.Attribute) and not isinstance(parents.get(node), ast.Attribute):
                root, attrs = _chain(node)
                if root == "slicer":
                    _add_slicer_attr(add, attrs)
                elif root == "qt":
                    add("qt", ".".join(attrs))
                elif root == "vtk":
                    add("vtk", ".".join(attrs))
                elif root in others or root in own:
                    continue
                else:
                    for attr in attrs:
                        if _CAMEL.match(attr) and attr not in own:
                            add("methods", attr)
    return usage


def _add_slicer_attr(add, attrs: List[str]) -> None:
    """Sort ``slicer.<attrs>`` into its kinds (the scene's methods count as methods)."""
    head, rest = attrs[0], attrs[1:]
    if head == "util":
        if rest:
            add("util", rest[0])
        return
    add("slicer", head)
    if _SLICER_CLASS.match(head):
        add("classes", head)
        for attr in rest[:1]:
            add("class_methods", f"{head}.{attr}")
        rest = rest[1:]
    for attr in rest:
        if _CAMEL.match(attr):
            add("methods", attr)


@pytest.fixture(scope="module")
def usage():
    return collect_usage()


def test_the_collector_sees_what_the_module_uses(usage):
    assert {"GetNodeByID", "SetTag", "SetApplyThreshold", "AddNewNodeByClass"} <= set(usage["methods"])
    assert {"vtkMRMLSegmentationNode", "vtkMRMLScalarVolumeNode", "vtkSlicerColorLogic"} <= set(usage["classes"])
    assert {"pip_install", "WaitCursor", "VTKObservationMixin"} <= set(usage["util"])
    assert "mrmlScene" in usage["slicer"] and "QTimer" in usage["qt"]
    assert "parameterNodeWrapper.parameterNodeWrapper" in usage["modules"]
    assert "vtkSlicerColorLogic.GetColorLegendDisplayNode" in usage["class_methods"]
    assert "SetTerminology" not in usage["methods"]  # missing from Slicer 5.8: must not come back unguarded


def test_the_collector_finds_an_unguarded_newer_api(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import slicer\n"
        "def f(segment, node):\n"
        "    segment.SetTerminology('x')\n"
        "    if hasattr(node, 'GetNewThing'):\n"
        "        node.GetNewThing()\n"
        "    scene = slicer.mrmlScene.AddNewNodeByClass('vtkMRMLTextNode')\n"
        "    return f'vtkMRMLColorTableNodeFile{node}.txt'\n"
    )
    found = collect_usage([sample])
    assert {"SetTerminology", "GetNewThing", "AddNewNodeByClass"} <= set(found["methods"])
    assert set(found["guarded"]) == {"GetNewThing"}
    assert set(found["classes"]) == {"vtkMRMLTextNode"}  # the f-string's fragment is no class
    assert not set(found["methods"]) - set(found["guarded"]) <= set(SLICER_5_8_0["methods"])


# ---------------------------------------------------------------------------------------------
# against Slicer 5.8.0 (frozen lookup, see above)


def _new_names(used: Iterable[str], known: Iterable[str], guarded: Iterable[str]) -> List[str]:
    return sorted(set(used) - set(known) - set(guarded))


def test_every_slicer_name_is_in_slicer_5_8_or_feature_checked(usage):
    guarded = set(usage["guarded"])
    hint = " not verified in Slicer v5.8.0: look it up there (see the module docstring) or guard it by hasattr"
    slicer_defined = _slicer_defined_methods()
    methods = {m for m in usage["methods"] if m in slicer_defined}
    assert not _new_names(methods, SLICER_5_8_0["methods"], guarded), hint
    assert not _new_names(usage["classes"], SLICER_5_8_0["classes"], guarded), hint
    assert not _new_names(usage["util"], SLICER_5_8_0["util"], guarded), hint
    modules = {f"{m}.{n}" for m, names in SLICER_5_8_0["modules"].items() for n in names}
    assert not _new_names(usage["modules"], modules, guarded), hint
    tops = {s for s in usage["slicer"] if s not in APPLICATION_ONLY and not _SLICER_CLASS.match(s)}
    assert not tops, f"slicer.{tops}: {hint}"
    assert set(usage["qt"]) <= QT_NAMES, f"new Qt names {set(usage['qt']) - QT_NAMES}: check them and add to QT_NAMES"
    for cls_method in usage["class_methods"]:
        cls, method = cls_method.split(".")
        assert cls in SLICER_5_8_0["methods"].get(method, []) or method in guarded, cls_method


# ---------------------------------------------------------------------------------------------
# against the installed slicer-core (CI: every release on PyPI, see run-slicer-compat.sh)


@functools.lru_cache(maxsize=None)
def _slicer_classes():
    return [getattr(slicer, n) for n in dir(slicer) if n.startswith("vtk") and isinstance(getattr(slicer, n), type)]


@functools.lru_cache(maxsize=None)
def _slicer_defined_methods() -> Set[str]:
    """Names that slicer-core's own classes declare (not inherited from VTK)."""
    names = set()
    for cls in _slicer_classes():
        for klass in cls.__mro__:
            if klass.__module__.split(".")[0] in ("slicer_core", "slicer"):
                names |= set(vars(klass))
    return names


@functools.lru_cache(maxsize=None)
def _vtk_names() -> Set[str]:
    """Every attribute of every class that slicer-core and VTK's data and common modules expose."""
    import vtkmodules.vtkCommonCore as core
    import vtkmodules.vtkCommonDataModel as data
    import vtkmodules.vtkCommonMath as math_
    import vtkmodules.vtkCommonTransforms as transforms

    names = set()
    classes = _slicer_classes() + [
        getattr(m, n)
        for m in (core, data, math_, transforms)
        for n in dir(m)
        if n.startswith("vtk") and isinstance(getattr(m, n), type)
    ]
    for cls in classes:
        names |= set(dir(cls))
    return names


def test_every_name_exists_in_the_installed_slicer_core_or_is_feature_checked(usage):
    guarded = set(usage["guarded"])
    version = _installed_slicer_core()
    known = _vtk_names()
    missing = [m for m in usage["methods"] if m not in known and m not in guarded]
    assert not missing, f"slicer-core {version} lacks {missing}; guard them by a feature check"
    for name in usage["classes"]:
        assert hasattr(slicer, name) or name in guarded, f"slicer-core {version} has no {name}"
    for cls_method in usage["class_methods"]:
        cls, method = cls_method.split(".")
        assert hasattr(getattr(slicer, cls), method) or method in guarded, f"slicer-core {version}: {cls_method}"
    for name in usage["util"]:
        assert hasattr(slicer.util, name) or name in guarded, f"slicer-core {version}: slicer.util.{name}"
    for name in usage["slicer"]:
        assert name in APPLICATION_ONLY or hasattr(slicer, name), f"slicer-core {version}: slicer.{name}"
    for name in usage["vtk"]:
        obj = vtk
        for part in name.split("."):
            obj = getattr(obj, part, None)
        assert obj is not None or name in guarded, f"vtk: {name}"


def _installed_slicer_core() -> str:
    from importlib.metadata import version

    return version("slicer-core")


def test_slicer_5_8_methods_are_declared_by_slicer_classes_here_too():
    """The frozen table names real declaring classes (a typo there would hide a missing API)."""
    for method, classes in SLICER_5_8_0["methods"].items():
        assert any(hasattr(getattr(slicer, c, None), method) for c in classes), (method, classes)
    for cls in SLICER_5_8_0["classes"]:
        assert hasattr(slicer, cls), cls


# ---------------------------------------------------------------------------------------------
# repeating the lookup in Slicer's source (needs a Slicer git checkout)


def declared_in_header(text: str, name: str) -> bool:
    """Whether a C++ header declares method (or enum value) ``name``; vtk(Get|Set)...Macro and
    vtkBooleanMacro declarations count."""
    if re.search(rf"\b{re.escape(name)}\s*\(", text) or re.search(rf"\b{re.escape(name)}\s*[,=}}]", text):
        return True
    for m in re.finditer(r"\bvtk(Get|Set)\w*Macro\s*\(\s*(\w+)", text):
        if m.group(1) + m.group(2) == name:
            return True
    return any(
        m.group(1) + suffix == name
        for m in re.finditer(r"\bvtkBooleanMacro\s*\(\s*(\w+)", text)
        for suffix in ("On", "Off")
    )


def lookup_in_slicer_source(git_dir: str, tag: str, usage) -> Dict[str, object]:
    """What ``tag`` of Slicer's repository declares of the names in ``usage`` (see SLICER_5_8_0)."""

    def show(path):
        return subprocess.run(["git", "-C", git_dir, "show", f"{tag}:{path}"], capture_output=True, text=True).stdout

    files = subprocess.run(
        ["git", "-C", git_dir, "ls-tree", "-r", "--name-only", tag], capture_output=True, text=True, check=True
    ).stdout.split()
    headers = {Path(f).stem: f for f in files if f.endswith(".h") and Path(f).stem.startswith("vtk")}
    methods = {}
    slicer_defined = _slicer_defined_methods()
    for method in sorted(m for m in usage["methods"] if m in slicer_defined):
        owners = sorted(
            {
                k.__name__
                for c in _slicer_classes()
                for k in c.__mro__
                if k.__module__.split(".")[0] == "slicer_core" and method in vars(k)
            }
        )
        found = [c for c in owners if c in headers and declared_in_header(show(headers[c]), method)]
        if found:
            methods[method] = found
    util = _top_level_names(show("Base/Python/slicer/util.py")) & set(usage["util"])
    classes = {c for c in usage["classes"] if c in headers}
    modules = {"ScriptedLoadableModule": _top_level_names(show("Base/Python/slicer/ScriptedLoadableModule.py"))}
    package = "Base/Python/slicer/parameterNodeWrapper/"
    modules["parameterNodeWrapper"] = set().union(
        *(_top_level_names(show(f)) for f in files if f.startswith(package) and f.endswith(".py"))
    )
    used_modules = defaultdict(set)
    for dotted in usage["modules"]:
        module, name = dotted.split(".")
        if name in modules.get(module, ()):
            used_modules[module].add(name)
    return {"methods": methods, "util": util, "classes": classes, "modules": dict(used_modules)}


def _top_level_names(source: str) -> Set[str]:
    """Functions and classes a Python file defines at its top level."""
    return {n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.skipif(not os.environ.get("SLICER_SOURCE"), reason="needs SLICER_SOURCE: a Slicer git checkout")
def test_the_frozen_lookup_matches_slicer_5_8_source(usage):
    found = lookup_in_slicer_source(os.environ["SLICER_SOURCE"], SLICER_5_8, usage)
    used_methods = {m for m in usage["methods"] if m in _slicer_defined_methods()}
    assert {m: SLICER_5_8_0["methods"][m] for m in used_methods if m in SLICER_5_8_0["methods"]} == found["methods"]
    assert found["util"] == set(usage["util"]) & SLICER_5_8_0["util"]
    assert found["classes"] == set(usage["classes"]) & SLICER_5_8_0["classes"]
    assert found["modules"] == {
        m: names & {u.split(".")[1] for u in usage["modules"] if u.startswith(m + ".")}
        for m, names in SLICER_5_8_0["modules"].items()
    }


#: Slicer tags whose parameterNodeWrapper was read for the GUI binding (issue 24, defect 2): in
#: v5.8.x ``_connectGui`` ends without ``return`` (so ``connectGui`` gives None and
#: ``disconnectGui(None)`` unbinds nothing; 5.10 fixed it); ``_connectParametersToGui`` returns its tag in all
WRAPPER_TAGS = {"v5.8.0": False, "v5.8.1": False, "v5.10.0": True, "v5.12.0": True}


def _returns_a_value(source: str, function: str) -> bool:
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn))


def test_the_panel_binds_the_gui_through_the_call_that_returns_a_tag():
    """The module binds with ``connectParametersToGui`` (through CARDSegmentLib.panel.gui.connect_gui),
    never ``connectGui``, whose tag is None on 5.8."""
    text = MODULE_FILE.read_text(encoding="utf-8")
    assert ".connectGui(" not in text and "lib.connect_gui(" in text
    assert ".connectParametersToGui(" in (LIB_DIR / "panel" / "gui.py").read_text(encoding="utf-8")


@pytest.mark.skipif(not os.environ.get("SLICER_SOURCE"), reason="needs SLICER_SOURCE: a Slicer git checkout")
@pytest.mark.parametrize("tag", sorted(WRAPPER_TAGS))
def test_connect_parameters_to_gui_returns_its_tag_in_slicer_source(tag):
    show = subprocess.run(
        ["git", "-C", os.environ["SLICER_SOURCE"], "show", f"{tag}:Base/Python/slicer/parameterNodeWrapper/wrapper.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert _returns_a_value(show, "_connectParametersToGui")
    assert _returns_a_value(show, "_connectGui") is WRAPPER_TAGS[tag]
    assert 'checkedSetAttr(classtype, "connectParametersToGui", _connectParametersToGui)' in show


# ---------------------------------------------------------------------------------------------
# slicer.packaging (Slicer 5.12 and later), which CARDSegmentLib/install/packages.py prefers where it exists

#: the parameters of the slicer.packaging functions the installer calls, in order, read in
#: Base/Python/slicer/packaging.py of PACKAGING_TAGS (Slicer's main branch at 583e9b3, August 2026,
#: has the same); v5.8.0 and v5.10.0 have no such file, and there the installer keeps slicer.util.pip_install
SLICER_PACKAGING = {
    "pip_ensure": (
        "requirements",
        "constraints",
        "skip_packages",
        "prompt_install",
        "prompt_restart",
        "requester",
        "skip_in_testing",
        "show_progress",
    ),
}
PACKAGING_TAGS = ("v5.12.0", "v5.12.3")
NO_PACKAGING_TAGS = ("v5.8.0", "v5.10.0")
INSTALLER = LIB_DIR / "install" / "packages.py"


def _packaging_calls(tree: ast.AST) -> Dict[str, List[ast.Call]]:
    """The ``packaging.<name>(...)`` calls (the installer's local name for ``slicer.packaging``)."""
    calls: Dict[str, List[ast.Call]] = defaultdict(list)
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and _chain(func)[0] == "packaging":
            calls[func.attr].append(node)
    return calls


def test_the_installer_calls_slicer_packaging_with_the_names_of_slicer_5_12():
    calls = _packaging_calls(ast.parse(INSTALLER.read_text(encoding="utf-8")))
    assert set(calls) == {"pip_ensure"}
    for name, found in calls.items():
        parameters = SLICER_PACKAGING[name]
        for call in found:
            keywords = {k.arg for k in call.keywords}
            assert None not in keywords and keywords <= set(parameters[len(call.args) :]), (name, keywords)
            assert len(call.args) <= len(parameters)


def test_the_installer_imports_slicer_packaging_behind_a_check():
    """5.8 and 5.10 have no slicer.packaging: it is imported by name inside a try that catches
    ImportError, and its function is looked up with getattr; no static import or attribute use."""
    source = INSTALLER.read_text(encoding="utf-8")
    tree = ast.parse(source)
    guarded_imports = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(getattr(h.type, "id", None) == "ImportError" for h in node.handlers)
        and 'import_module("slicer.packaging")' in ast.get_source_segment(source, node)
    ]
    assert len(guarded_imports) == 1
    assert 'getattr(packaging, "pip_ensure", None)' in source
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n.startswith("slicer.packaging") for n in names)
        if isinstance(node, ast.Attribute):
            assert _chain(node)[1][:1] != ["packaging"] or _chain(node)[0] != "slicer"


@pytest.mark.skipif(not os.environ.get("SLICER_SOURCE"), reason="needs SLICER_SOURCE: a Slicer git checkout")
@pytest.mark.parametrize("tag", PACKAGING_TAGS + NO_PACKAGING_TAGS)
def test_slicer_packaging_is_as_recorded_in_slicer_source(tag):
    shown = subprocess.run(
        ["git", "-C", os.environ["SLICER_SOURCE"], "show", f"{tag}:Base/Python/slicer/packaging.py"],
        capture_output=True,
        text=True,
    )
    if tag in NO_PACKAGING_TAGS:
        assert shown.returncode != 0, f"{tag} has slicer.packaging: the installer could use it there too"
        return
    functions = {n.name: n for n in ast.parse(shown.stdout).body if isinstance(n, ast.FunctionDef)}
    for name, parameters in SLICER_PACKAGING.items():
        assert tuple(a.arg for a in functions[name].args.args) == parameters, (tag, name)


if __name__ == "__main__":  # print the lookup for a Slicer checkout: python test_slicer_compat.py /path/to/Slicer
    import pprint

    pprint.pprint(
        lookup_in_slicer_source(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else SLICER_5_8, collect_usage())
    )

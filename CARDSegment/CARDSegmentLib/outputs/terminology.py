"""Slicer terminology entries for the usual cardiac class names (used when the bundle gives none).

A Slicer terminology string: context~category~type~type modifier~anatomic context~region~modifier.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

TERMINOLOGY_CONTEXT = "Segmentation category and type - DICOM master list"
#: the module's own terminology (Resources/Terminology/CARDSegment.term.json): the myocardium
#: (SCT 74281007) is in no terminology file Slicer ships (5.8.1, 5.10, main); LV and RV are
MODULE_CONTEXT = "CARDSegment - cardiac structures"
MODULE_TERMINOLOGY_FILE = ("Resources", "Terminology", "CARDSegment.term.json")
ANATOMIC_CONTEXT = "Anatomic codes - DICOM master list"
#: lower-case class name -> (SNOMED CT code, meaning)
CARDIAC_TYPES = {
    "lv": ("87878005", "Left ventricle"),
    "left ventricle": ("87878005", "Left ventricle"),
    "lv cavity": ("87878005", "Left ventricle"),
    "lv blood pool": ("87878005", "Left ventricle"),
    "rv": ("53085002", "Right ventricle"),
    "right ventricle": ("53085002", "Right ventricle"),
    "rv cavity": ("53085002", "Right ventricle"),
    "myo": ("74281007", "Myocardium"),
    "myocardium": ("74281007", "Myocardium"),
    "lv myocardium": ("74281007", "Myocardium"),
}


#: codes that Slicer's DICOM master list lacks: their entries name the module's own terminology
MODULE_ONLY_CODES = {"74281007"}


def segment_terminology(name: str) -> Optional[str]:
    """Slicer terminology for a cardiac class name (LV, RV, MYO, ...), or None.

    LV and RV refer to Slicer's DICOM master list, the myocardium to the module's own terminology
    (:data:`MODULE_CONTEXT`, loaded by :func:`register_module_terminology`).
    """
    code = CARDIAC_TYPES.get(name.strip().lower())
    if code is None:
        return None
    value, meaning = code
    context = MODULE_CONTEXT if value in MODULE_ONLY_CODES else TERMINOLOGY_CONTEXT
    return f"{context}~SCT^123037004^Anatomical Structure~SCT^{value}^{meaning}~^^~{ANATOMIC_CONTEXT}~^^~^^"


def register_module_terminology(terminologies_logic, module_dir: str) -> bool:
    """Load the module's terminology into Slicer's Terminologies logic once; True when it is loaded.

    ``terminologies_logic`` is ``slicer.modules.terminologies.logic()`` (None outside Slicer: nothing
    to do). A file that cannot be loaded is logged; segments keep their entries either way.
    """
    if terminologies_logic is None:
        return False
    import vtk

    names = vtk.vtkStringArray()
    terminologies_logic.GetLoadedTerminologyNames(names)
    if MODULE_CONTEXT in {names.GetValue(i) for i in range(names.GetNumberOfValues())}:
        return True
    path = os.path.join(module_dir, *MODULE_TERMINOLOGY_FILE)
    loaded = terminologies_logic.LoadTerminologyFromFile(path)
    if loaded != MODULE_CONTEXT:
        logging.getLogger(__name__).warning("CARDSegment: could not load the terminology %s", path)
        return False
    return True


def set_segment_terminology(segment, entry: str) -> None:
    """Give ``segment`` a terminology entry, in the way every supported Slicer understands.

    ``vtkSegment.SetTerminology`` is missing from Slicer 5.8 (it came with 5.10) and only stores
    the entry as the segment's tag named ``GetTerminologyEntryTagName()``, which Slicer 5.8
    already reads and writes in the same format. Setting that tag directly works on all of them.
    """
    segment.SetTag(segment.GetTerminologyEntryTagName(), entry)

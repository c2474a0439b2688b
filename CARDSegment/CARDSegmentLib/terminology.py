"""Slicer terminology entries for the usual cardiac class names (used when the bundle gives none).

A Slicer terminology string: context~category~type~type modifier~anatomic context~region~modifier.
"""

from __future__ import annotations

from typing import Optional

TERMINOLOGY_CONTEXT = "Segmentation category and type - DICOM master list"
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


def segment_terminology(name: str) -> Optional[str]:
    """Slicer terminology for a cardiac class name (LV, RV, MYO, ...), or None."""
    code = CARDIAC_TYPES.get(name.strip().lower())
    if code is None:
        return None
    value, meaning = code
    return (f"{TERMINOLOGY_CONTEXT}~SCT^123037004^Anatomical Structure~SCT^{value}^{meaning}~^^~"
            f"{ANATOMIC_CONTEXT}~^^~^^")


def set_segment_terminology(segment, entry: str) -> None:
    """Give ``segment`` a terminology entry, in the way every supported Slicer understands.

    ``vtkSegment.SetTerminology`` is missing from Slicer 5.8 (it came with 5.10) and only stores
    the entry as the segment's tag named ``GetTerminologyEntryTagName()``, which Slicer 5.8
    already reads and writes in the same format. Setting that tag directly works on all of them.
    """
    segment.SetTag(segment.GetTerminologyEntryTagName(), entry)

"""Outputs and review: an engine's output folder as MRML nodes, and the reader's review of them.

:mod:`.nodes` (roles, finding, releasing and removing this module's nodes) is the bottom;
:mod:`.geometry`, :mod:`.volume_files`, :mod:`.terminology` and :mod:`.views` sit on it;
:mod:`.colormaps` and :mod:`.overlays` (disagreement and temperature in the slice views),
:mod:`.region_outlines` (each flagged region's own voxels) and :mod:`.review` (the review table,
the selected region's highlight, export) on those; :mod:`.loading` (one output folder to nodes on
the input's exact geometry, replacing earlier outputs) on them all.
"""

"""The panel, without Qt: :mod:`.gui` (GUI binding, default input, removed nodes, double clicks,
export file names, elapsed time), :mod:`.parameters` (the panel's choices as job options),
:mod:`.summary` (the agreement score in words), :mod:`.about` (help and acknowledgement texts),
:mod:`.logic` (the module's Logic: runs polled by a timer it is given, results shown, reviewed and
exported) and :mod:`.selftest` (the self-test's steps). The top of the library.
"""

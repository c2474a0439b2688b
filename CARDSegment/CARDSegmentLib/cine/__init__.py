"""The cine: :mod:`.sequences` (the sequence behind the input, which frames to segment, the ED/ES
rule from the engine, results recorded as sequences of the input's browser), :mod:`.stack` (a
study's single-slice series combined into one cine), :mod:`.job` (one run over a sequence's
frames, loaded a frame at a time), :mod:`.results` (the cardiac indices the engine wrote, shown and
exported with every frame's review) and :mod:`.curves` (the volume curves and the wall-thickness
table as MRML tables and a plot).
"""

"""The cine: :mod:`.sequences` (the sequence behind the input, which frames to segment, the ED/ES
rule from the engine, results recorded as sequences of the input's browser), :mod:`.job` (one run
over a sequence's frames, loaded a frame at a time) and :mod:`.results` (the cardiac indices the
engine wrote, shown and exported with every frame's review).
"""

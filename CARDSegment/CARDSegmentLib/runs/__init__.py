"""Jobs and the engine process.

:mod:`.stages` places the engine's stages on the progress bar; :mod:`.process` builds an engine
command, starts the child (a real subprocess or a test's launcher), reads its progress lines and its
one-line error, and kills it with its process tree; :mod:`.engine` keeps one warm ``cardseg serve``
child between clicks; :mod:`.child` is the one path that starts, polls and cancels the engine child
of every job's step; :mod:`.jobs` is one "Segment & Calibrate" of a volume (input to a temporary
file, run, outputs to nodes) driven by :class:`~.jobs.JobMonitor` from the panel's timer.
"""

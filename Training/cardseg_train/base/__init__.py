"""Helpers every part of the training tools shares: cache keys, ``--out`` records, report files, plots, statistics and command-line options."""

"""What a batch writes at OUTDIR's top level (beside one folder per case); see :mod:`cardseg.cohort.batch`."""

import re

BATCH_STAMP = ".cardseg-batch.json"
STATE_FILE = ".cardseg-batch-state.jsonl"
LOCK_FILE = ".cardseg-batch.lock"
COHORT_CSV = "cohort.csv"
COHORT_PARQUET = "cohort.parquet"
SUBJECTS_CSV = "subjects.csv"
TRIAGE_HTML = "triage.html"
#: the cine subjects' LV and RV volume curves, one row per frame (:mod:`cardseg.cohort.cine`)
CURVES_CSV = "curves.csv"
#: the fast passes' curves, one line each: a rerun finds a cine's ED and ES without segmenting it again
CURVES_STATE = ".cardseg-batch-curves.jsonl"
#: every file a batch writes at OUTDIR's top level (each may also exist as ``.<name>.tmp`` while written)
OWN_FILES = (
    BATCH_STAMP,
    STATE_FILE,
    LOCK_FILE,
    COHORT_CSV,
    COHORT_PARQUET,
    SUBJECTS_CSV,
    TRIAGE_HTML,
    CURVES_CSV,
    CURVES_STATE,
)
#: files ``segment`` leaves beside a case folder while it writes or after a kill (its own names)
SEGMENT_LEFTOVER = re.compile(r"^\..+\.cardseg(-tmp|-old|\.lock)$")

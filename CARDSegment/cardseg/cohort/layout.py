"""What a batch writes at OUTDIR's top level (beside one folder per case); see :mod:`cardseg.cohort.batch`."""

import re

BATCH_STAMP = ".cardseg-batch.json"
STATE_FILE = ".cardseg-batch-state.jsonl"
LOCK_FILE = ".cardseg-batch.lock"
COHORT_CSV = "cohort.csv"
COHORT_PARQUET = "cohort.parquet"
SUBJECTS_CSV = "subjects.csv"
TRIAGE_HTML = "triage.html"
#: every file a batch writes at OUTDIR's top level (each may also exist as ``.<name>.tmp`` while written)
OWN_FILES = (BATCH_STAMP, STATE_FILE, LOCK_FILE, COHORT_CSV, COHORT_PARQUET, SUBJECTS_CSV, TRIAGE_HTML)
#: files ``segment`` leaves beside a case folder while it writes or after a kill (its own names)
SEGMENT_LEFTOVER = re.compile(r"^\..+\.cardseg(-tmp|-old|\.lock)$")

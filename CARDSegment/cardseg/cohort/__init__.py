"""Many cases: ``cardseg batch`` (manifest, resume state, workers here or on Ray, cohort and
subject tables), the triage report and the cardiac indices with intervals."""

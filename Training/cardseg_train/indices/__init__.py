"""The cardiac-index intervals: evidence, fit (``cardseg fit-indices``), report and bootstrap statistics."""

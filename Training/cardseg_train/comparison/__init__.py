"""The paper's Table I and Table II (``cardseg compare``, ``cardseg ablate``) from evaluations."""

"""The flagged-region rule and ``p_error``: fitted on validation (``cardseg fit-review``), measured by ``cardseg evaluate``."""

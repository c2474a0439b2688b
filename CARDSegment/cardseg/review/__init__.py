"""Review of one result: flagged regions of high trajectory disagreement, and how much of the real
errors they cover."""

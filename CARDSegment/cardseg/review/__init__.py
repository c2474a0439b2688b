"""Review of one result: flagged regions of high trajectory disagreement, and how well they catch
the real errors."""

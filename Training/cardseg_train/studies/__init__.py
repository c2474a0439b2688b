"""One-off studies that answered a question on validation; kept in the source tree to reproduce their committed result files, not shipped in the wheel."""

"""The ``cardseg`` subcommands the training tools add (found by entry point; thin: parse, check, call the library)."""

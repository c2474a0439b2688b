"""The one exception type the command line turns into a one-line error and exit code 2."""


class CardsegError(Exception):
    """A problem with the user's input, bundle or options, described in one line."""

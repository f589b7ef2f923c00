"""The base of every error a user can cause (bad config, file, argument): the command line
prints its one-line message and exits with status 2, without a traceback."""


class TformerError(ValueError):
    """A user-facing error whose message names what is wrong and what is allowed."""

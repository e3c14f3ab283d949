"""The one error type for bad input: the command line prints its message, without a traceback."""


class BadInput(ValueError):
    """Input the user can fix: an unknown id, a missing extra, an invalid setting.

    The message always says how to fix the problem.
    """

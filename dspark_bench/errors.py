"""The one exception type the CLI turns into a clean one-line error."""


class DsparkError(Exception):
    """A user-facing error: bad input, a bad model pair, an unusable file.

    The message is a single line that says what is wrong and, where it helps, what to do.
    """

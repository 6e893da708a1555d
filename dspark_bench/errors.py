"""The one exception type the CLI turns into a clean one-line error."""


class DsparkError(Exception):
    """A user-facing error: bad input, a bad model pair, an unusable file.

    The message is a single line that says what is wrong and, where it helps, what to do.
    """


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of a library's error message (its type's name when it has none), for a
    one-line DsparkError: third-party messages run over many lines, or are empty."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__

"""The one error type of the library, and how error messages show the values and the errors they name."""


class ShardingError(ValueError):
    """Raised for any invalid mesh, sharding type, step or plan request.

    The message names the offending part in the user's own terms (the text they wrote, the axis or dim
    they named), so that it can be shown to them as it is.
    """


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` for an error message: cut short past ``limit`` characters, and a huge int by its size
    (Python will not print an int of over 4,300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"(an integer of {value.bit_length()} bits)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 12]}…{text[-8:]}"


def first_line(e: BaseException) -> str:
    """The first line of another library's error, to quote in a one-line message (its type where it says
    nothing)."""
    return next(iter(str(e).splitlines()), "") or type(e).__name__

"""The one error type of the library."""


class ShardingError(ValueError):
    """Raised for any invalid mesh, sharding type, step or plan request.

    The message names the offending part in the user's own terms (the text they wrote, the axis or dim
    they named), so that it can be shown to them as it is.
    """

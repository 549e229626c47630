"""The one error of the data package: a dataset that cannot be prepared or sampled as asked."""


class DataError(ValueError):
    """A dataset that cannot be prepared or sampled as asked; the message says what to change."""

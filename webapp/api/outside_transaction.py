"""Views that wait on something else (a long poll, a model server) and write nothing, kept out of the request's
transaction (ATOMIC_REQUESTS): on SQLite a transaction holds the write lock the workers need, and on PostgreSQL a
transaction open for a long wait holds back vacuum."""
from django.db import connection, transaction


class OutsideRequestTransaction:
    """A mixin for an APIView, before it among the bases."""

    @classmethod
    def as_view(cls, **initkwargs):
        return transaction.non_atomic_requests(super().as_view(**initkwargs))

    def handle_exception(self, exc):
        # DRF marks the transaction it finds open for rollback when it answers an error, taking it for the
        # request's own; outside ATOMIC_REQUESTS a transaction open around this view (a test's) is not this view's.
        outer = connection.in_atomic_block
        marked = outer and transaction.get_rollback()
        response = super().handle_exception(exc)
        if outer and not marked:
            transaction.set_rollback(False)
        return response

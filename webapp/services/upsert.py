"""Insert-or-replace many rows in one statement: ingestion writes hundreds of thousands of rows a second this way,
where model instances and the ORM's bulk_create spend most of the time building objects and SQL text.

PostgreSQL gets each column as one array parameter, bound on the server in binary (``unnest``), so a batch is one
statement whatever its size and no value is quoted into SQL text (Django's cursors bind on the client, which for
arrays of a hundred thousand floats costs seconds). SQLite gets the same INSERT … ON CONFLICT once a row
(``executemany``, which it runs in process).
"""
from __future__ import annotations

from django.db import connection
from django.db.models import Model

CHUNK_ROWS = 50_000  # bounds the memory one statement takes, not the speed


def upsert(model: type[Model], columns: list[str], keys: list[str], rows: list[tuple]) -> None:
    """Write ``rows`` (tuples in the order of ``columns``, database column names, values as the database takes
    them) into ``model``'s table; a row whose ``keys`` exist gets the other ``columns`` and keeps the rest."""
    if not rows:
        return
    quote = connection.ops.quote_name
    table, names = quote(model._meta.db_table), ", ".join(quote(c) for c in columns)
    updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns if c not in keys)
    conflict = f"ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET {updates}"
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"%b::{_column_type(model, c)}[]" for c in columns)
        with _server_bound_cursor() as cursor:
            for chunk in _chunks(rows):
                cursor.execute(f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) {conflict}",
                               [list(column) for column in zip(*chunk)])
        return
    marks = ", ".join(["%s"] * len(columns))
    with connection.cursor() as cursor:
        for chunk in _chunks(rows):
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks}) {conflict}", chunk)


def _chunks(rows: list[tuple]):
    for at in range(0, len(rows), CHUNK_ROWS):
        yield rows[at:at + CHUNK_ROWS]


def _server_bound_cursor():
    """A psycopg cursor on Django's connection (so inside its transaction) that binds parameters on the server."""
    import psycopg

    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)


def _column_type(model: type[Model], column: str) -> str:
    field = next(f for f in model._meta.concrete_fields if f.column == column)
    return field.db_type(connection)  # a foreign key's is its target's

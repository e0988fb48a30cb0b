"""Statements that write thousands of rows at once, with one array per column bound in binary.

Django's psycopg cursors bind on the client: every value is quoted into the statement's text. An
admission cycle at 10,000 queued jobs writes 8,500 reasons, a thousand claims and their events, and
9,000 allocations; quoting those values cost more CPU than PostgreSQL spent on the statements (an
array of 8,500 reasons: about 110 ms quoted, 15 ms bound in binary by the server). Here a statement
carries one array per column (``unnest``), bound by the server in binary, on the default connection
and in its current transaction, logged as any other query (``CaptureQueriesContext`` counts them).

SQLite (the embedded default) gets the same statements with the rows spelled out as ``VALUES``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import (
    BooleanField,
    CharField,
    DateTimeField,
    Field,
    ForeignKey,
    IntegerField,
    Model,
    TextField,
)

# Rows per statement on SQLite, whose statements take at most 32,766 parameters.
SQLITE_ROWS = 500


@contextmanager
def array_cursor() -> Iterator[CursorWrapper]:
    """A cursor on the default PostgreSQL connection, in its transaction, whose ``%b`` placeholders the
    server binds in binary (an array of a million values costs what psycopg's binary dumper costs)."""
    if connection.vendor != "postgresql":
        raise RuntimeError(f"array_cursor needs PostgreSQL, not {connection.vendor}")
    # What connection.cursor() checks first: the connection is this thread's, and still usable.
    connection.validate_thread_sharing()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    # Django opens its connections with prepare_threshold None: this cursor, as its own, never prepares.
    raw = psycopg.Cursor(connection.connection)
    # Django's own wrappers, as ``connection.cursor()`` gives: queries are logged when they would be.
    cursor = CursorDebugWrapper(raw, connection) if connection.queries_logged else CursorWrapper(raw, connection)
    with cursor:
        yield cursor


def _fields(model: type[Model], names: Sequence[str]) -> list[Field[Any, Any]]:
    fields = [model._meta.get_field(name) for name in names]
    for field in fields:
        if not isinstance(field, Field) or not field.concrete:
            raise ValueError(f"{model.__name__}.{field.name} is not a column")
    return fields  # type: ignore[return-value]


def _column(field: Field[Any, Any]) -> str:
    """The field's column, quoted."""
    if field.column is None:
        raise ValueError(f"{field.name} has no column")
    return connection.ops.quote_name(field.column)


def _ready_type(field: Field[Any, Any]) -> type | None:
    """The Python type whose values the field would hand the database unchanged, if any: such a value
    skips ``get_db_prep_save``, which costs ~6 us a value (a cycle writes 40,000 of them). A JSON value
    always goes through it; a datetime only on PostgreSQL, which takes an aware one as it is."""
    target = field.target_field if isinstance(field, ForeignKey) else field
    if isinstance(target, BooleanField):
        return bool
    if isinstance(target, IntegerField):  # the auto fields too
        return int
    if isinstance(target, CharField | TextField):
        return str
    if isinstance(target, DateTimeField) and connection.vendor == "postgresql":
        return datetime
    return None


def _columns(fields: Sequence[Field[Any, Any]], rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """One list per field, of the values as the database takes them (a dict as JSON, a datetime as a timestamp)."""
    columns: list[list[Any]] = [[] for _ in fields]
    ready = [_ready_type(field) for field in fields]
    for row in rows:
        if len(row) != len(fields):
            raise ValueError(f"a row has {len(row)} values for {len(fields)} fields")
        for column, field, kind, value in zip(columns, fields, ready, row, strict=True):
            if type(value) is kind and (not isinstance(value, datetime) or value.tzinfo is not None):
                column.append(value)
                continue
            if hasattr(value, "resolve_expression"):
                raise TypeError(f"{field.name}: an expression cannot be written in bulk, only a value")
            if isinstance(value, Model):  # a related row, for a foreign key: its key
                value = value.pk
            column.append(field.get_db_prep_save(value, connection))
    return columns


def _array_type(field: Field[Any, Any]) -> str:
    # A string goes as unbounded text: a cast to varchar(n) would cut a longer one without a word, where
    # writing it into the varchar(n) column refuses it, as the ORM's writes do.
    if isinstance(field, CharField | TextField):
        return connection.ops.cast_char_field_without_max_length
    return field.cast_db_type(connection) or ""


def _arrays(fields: Sequence[Field[Any, Any]]) -> str:
    return ", ".join(f"%b::{_array_type(field)}[]" for field in fields)


def _value_chunks(columns: Sequence[Sequence[Any]]) -> Iterator[tuple[str, list[Any]]]:
    """SQLite's form of the columns: ``VALUES (%s, ...), ...`` and its parameters, ``SQLITE_ROWS`` rows at a time."""
    count = len(columns[0])
    for start in range(0, count, SQLITE_ROWS):
        chunk = list(zip(*(column[start : start + SQLITE_ROWS] for column in columns), strict=True))
        placeholders = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(chunk))
        yield f"VALUES {placeholders}", [value for row in chunk for value in row]


def insert_rows(model: type[Model], names: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Insert ``rows`` (values in the order of the fields ``names``) into the model's table; returns how
    many. No ``save()``, no signals, no defaults: as ``bulk_create``, but every column is given."""
    rows = list(rows)
    if not rows:
        return 0
    fields = _fields(model, names)
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(_column(field) for field in fields)
    values = _columns(fields, rows)
    if connection.vendor == "postgresql":
        with array_cursor() as cursor:
            # S608: only our own quoted identifiers and column types are spliced in; every value is a parameter.
            cursor.execute(f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({_arrays(fields)})", values)  # noqa: S608
            return int(cursor.rowcount)
    inserted = 0
    with connection.cursor() as cursor:
        for rows_sql, params in _value_chunks(values):
            cursor.execute(f"INSERT INTO {table} ({columns}) {rows_sql}", params)
            inserted += cursor.rowcount
    return inserted


def update_rows(
    model: type[Model],
    names: Sequence[str],
    rows: Mapping[int, Sequence[Any]],
    *,
    where: Mapping[str, Any] | None = None,
    only_changed: bool = False,
) -> int:
    """Set the fields ``names`` of each row whose primary key is a key of ``rows`` to its values, in one
    statement (per 500 rows on SQLite); returns how many rows it changed. ``where``: field -> value that a
    row must also have (a state it must still be in). ``only_changed``: rows that already hold those
    values are left alone (no dead row version, no write), and not counted."""
    if not rows or not names:
        return 0
    fields = _fields(model, names)
    conditions = dict(where or {})
    where_fields = _fields(model, list(conditions))
    where_values = [field.get_db_prep_save(conditions[field.name], connection) for field in where_fields]
    pk = model._meta.pk
    if pk is None:
        raise ValueError(f"{model.__name__} has no primary key")
    table = connection.ops.quote_name(model._meta.db_table)
    values = _columns([pk, *fields], [(key, *row) for key, row in rows.items()])
    # v's columns: c0 the key, c1... the fields in order.
    names_v = [f"c{index}" for index in range(len(values))]
    pairs = [(f"{table}.{_column(field)}", f"v.c{index}") for index, field in enumerate(fields, start=1)]
    assignments = ", ".join(f"{_column(field)} = v.c{index}" for index, field in enumerate(fields, start=1))
    placeholder = "%b" if connection.vendor == "postgresql" else "%s"
    tests = [f"{table}.{_column(pk)} = v.c0"]
    tests += [f"{table}.{_column(field)} = {placeholder}" for field in where_fields]
    if only_changed:
        distinct = "IS DISTINCT FROM" if connection.vendor == "postgresql" else "IS NOT"
        tests.append("(" + " OR ".join(f"{old} {distinct} {new}" for old, new in pairs) + ")")
    condition = " AND ".join(tests)
    if connection.vendor == "postgresql":
        with array_cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {assignments} FROM unnest({_arrays([pk, *fields])}) "  # noqa: S608 (as above)
                f"AS v({', '.join(names_v)}) WHERE {condition}",
                [*values, *where_values],
            )
            return int(cursor.rowcount)
    changed = 0
    # VALUES names its columns column1, column2, ... on SQLite: a subquery renames them.
    renamed = ", ".join(f"column{index + 1} AS {name}" for index, name in enumerate(names_v))
    with connection.cursor() as cursor:
        for rows_sql, params in _value_chunks(values):
            cursor.execute(
                f"UPDATE {table} SET {assignments} FROM (SELECT {renamed} FROM ({rows_sql})) AS v "  # noqa: S608
                f"WHERE {condition}",
                [*params, *where_values],
            )
            changed += cursor.rowcount
    return changed

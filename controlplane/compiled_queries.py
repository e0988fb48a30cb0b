"""Reads whose SQL never changes, compiled once per process.

Django builds and compiles a queryset's SQL every time it runs. For the admission cycle's reads that
costs more than the database does: building the free-device query (three subqueries) alone takes 2-6 ms
of CPU, and a cycle runs after every submission and every finish, on the workers that 64 concurrent
submitters compete with for the CPU. A read whose statement and parameters are the same every time
(no value of the moment in it) is built and compiled on its first use and only executed after that;
its rows pass through the converters the ORM would have applied, so callers get what
``values_list`` gives.

Only ``values_list`` querysets with constant parameters belong here: a queryset that filters on
``now``, on ids or on a caller's argument would run with its first parameters forever.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django.db import connections
from django.db.models import QuerySet
from django.db.models.query import ValuesListIterable
from django.db.models.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class _Compiled:
    alias: str
    sql: str
    params: tuple[Any, ...]
    # Its converters turn the database's values into the fields' Python values. Kept without the
    # connection of the thread that compiled it (which would then never be let go): each read lends a
    # copy its own thread's connection.
    compiler: SQLCompiler


_compiled: dict[str, _Compiled] = {}


def _compile(key: str, queryset: QuerySet[Any, Any]) -> _Compiled:
    query = queryset.query
    # What ValuesListIterable returns without reordering: the fields named, annotations last.
    names = [*query.extra_select, *query.values_select, *query.annotation_select]
    fields = list(getattr(queryset, "_fields", None) or ())  # what values_list named (private to Django)
    if queryset._iterable_class is not ValuesListIterable or fields != names:
        raise TypeError(f"{key}: only a values_list of fields (annotations named last) is compiled once")
    compiler = query.get_compiler(using=queryset.db)
    sql, params = compiler.as_sql()
    cast(Any, compiler).connection = None
    return _Compiled(alias=queryset.db, sql=sql, params=tuple(params), compiler=compiler)


def rows(key: str, build: Callable[[], QuerySet[Any, Any]]) -> list[tuple[Any, ...]]:
    """The rows of ``build()``, a ``values_list`` queryset whose parameters never change, as tuples.

    ``key`` names the read, unique in the project; ``build`` is called once per process, the first time.
    """
    entry = _compiled.get(key)
    if entry is None:
        entry = _compiled[key] = _compile(key, build())
    connection = connections[entry.alias]
    with connection.cursor() as cursor:
        cursor.execute(entry.sql, entry.params)
        fetched = cursor.fetchall()
    compiler = copy.copy(entry.compiler)
    compiler.connection = connection
    return [tuple(row) for row in compiler.results_iter(results=[fetched])]

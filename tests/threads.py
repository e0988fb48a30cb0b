"""Concurrent clients for the tests that race: threads released together."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def at_once(count: int, action: Callable[[int], T]) -> list[T]:
    """``action(0)`` … ``action(count - 1)``, each in a thread of its own, released together at a barrier
    (concurrent clients); their results in order. Each thread closes its database connections; the
    first error of any of them is raised once all have ended."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        from django.db import connections

        try:
            barrier.wait()
            results[index] = action(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results

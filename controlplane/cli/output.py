"""What the CLI writes: machine output alone on stdout, every human line on stderr.

``-o json`` and ``-o yaml`` write the API's own objects; ``-o name`` one ``kind/id`` per line (what a
script feeds to the next command); ``-o table`` a table for people. Messages, progress and errors go to
stderr, so that ``polychip submit job.yaml -o json | jq .id`` reads nothing but the JSON. ``--quiet``
silences the messages; ``NO_COLOR`` (or a stderr that is not a terminal) drops colour.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

FORMATS = ("table", "json", "yaml", "name")


@dataclass(frozen=True)
class Column:
    title: str
    value: Callable[[dict[str, Any]], Any]
    justify: str = "left"


@dataclass
class Out:
    fmt: str = "table"
    quiet: bool = False

    def say(self, message: str) -> None:
        """A line for the person at the terminal (stderr), unless ``--quiet``."""
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)

    def show(
        self, data: Any, *, kind: str, columns: Sequence[Column], rows: Iterable[dict[str, Any]] | None = None
    ) -> None:
        """``data`` as asked; ``rows`` (default: ``data`` itself, or its one object) for the table and names."""
        if self.fmt == "json":
            sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        elif self.fmt == "yaml":
            import yaml

            sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        else:
            items = list(rows if rows is not None else (data if isinstance(data, list) else [data]))
            if self.fmt == "name":
                sys.stdout.write("".join(f"{kind}/{item.get('id', item.get('name'))}\n" for item in items))
            else:
                table(items, columns)
        sys.stdout.flush()


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(items: Sequence[dict[str, Any]], columns: Sequence[Column]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in columns:
        grid.add_column(column.title, justify=column.justify, overflow="fold")  # type: ignore[arg-type]
    for item in items:
        grid.add_row(*(_text(column.value(item)) for column in columns))
    Console(file=sys.stdout, soft_wrap=False).print(grid)


def stderr_console() -> Any:
    from rich.console import Console

    return Console(file=sys.stderr)

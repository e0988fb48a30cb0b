"""The API's JSON parser: a body that Python or PostgreSQL cannot take is a 400 naming where it is wrong.

DRF's own parser turns malformed JSON into a 400, but three kinds of well-formed JSON used to reach
the database or the interpreter's limits and come back as 500s: nesting deep enough to exhaust the
recursion limit (also on the unauthenticated ingest route), a NUL character (PostgreSQL's text
refuses it) and a lone UTF-16 surrogate (not encodable as UTF-8). This parser refuses each of them,
anywhere in the body, keys included, with the path of the first one it meets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# No request body of the API nests deeper than a handful of levels; a job spec's is about four.
MAX_DEPTH: Final = 32


class BadJSON(ParseError):
    """A 400 that names the field at fault (``controlplane.errors`` keeps ``field``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def unfit_text(text: str) -> str | None:
    """Why ``text`` cannot be stored, or None: a NUL, or a lone surrogate."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate, which is not text"
    return None


def _check(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise BadJSON(path or "body", f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if why := unfit_text(value):
            raise BadJSON(path or "body", why)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if why := unfit_text(str(key)):
                raise BadJSON(path or "body", f"a key {why}")
            _check(item, where, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1)


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise BadJSON("body", f"nests too deeply (at most {MAX_DEPTH} levels)") from None
        _check(data, "", 0)
        return data


def loads_strict(text: str) -> Any:
    """``json.loads`` with the same refusals, for code that reads JSON outside DRF."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise BadJSON("body", f"nests too deeply (at most {MAX_DEPTH} levels)") from None
    _check(data, "", 0)
    return data


class YamlParser(StrictJSONParser):
    """A job spec written as YAML (``Content-Type: application/yaml``), as people write them by hand
    and as the portal's editor sends them. Safe loading only (no Python objects); the value then gets
    the same checks as JSON, and a syntax error names its line and column."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            value = yaml.load(stream.read().decode("utf-8"), Loader=NoAliasSafeLoader)  # noqa: S506  (a safe loader)
        except RecursionError:
            raise BadJSON("body", f"nests too deeply (at most {MAX_DEPTH} levels)") from None
        except UnicodeDecodeError:
            raise BadJSON("body", "is not UTF-8 text") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "is not valid YAML"
            raise BadJSON("body", f"YAML{where}: {problem}") from None
        _check(value, "", 0)
        return value


class NoAliasSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a spec never needs one, and a few nested aliases name a
    structure exponentially larger than the text (the "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            raise yaml.constructor.ConstructorError(
                None, None, "aliases (*name) are not accepted; write the value out", self.peek_event().start_mark
            )
        return super().compose_node(parent, index)

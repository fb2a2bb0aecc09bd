"""Types of the JSON that liftlog writes: what ``json.dumps`` takes without a ``default``.

``Sequence`` and ``Mapping`` rather than ``list`` and ``dict`` keep the alias covariant, so a
``list[str]`` or a ``dict[str, int]`` is a ``JSONValue`` as it stands. What is read back
(``json.loads``) is checked field by field where it is used, and stays untyped until then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

__all__ = ["JSONObject", "JSONValue"]

JSONValue: TypeAlias = "str | int | float | bool | Sequence[JSONValue] | Mapping[str, JSONValue] | None"
#: A JSON object being built (the usual top level of what liftlog writes).
JSONObject: TypeAlias = "dict[str, JSONValue]"

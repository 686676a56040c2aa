"""A small JSON Schema 2020-12 evaluator for the keywords ``schemas/package-config.v1.json`` uses.

It exists so the schema is *executed* in tests without a third-party dependency: the agent's
own validator and the published schema must give the same verdict on every document in the
corpus. :data:`SUPPORTED` lists what is implemented; a test fails if the schema starts using
any other keyword, so this evaluator can never silently ignore a rule.

Patterns run on Python's ``re``; the schema only uses constructs that mean the same in
ECMA-262 (a test keeps ``$``, which does not, out of it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "default", "examples"}
)
SUPPORTED = ANNOTATIONS | {
    "$defs", "$ref", "type", "const", "enum", "properties", "required", "additionalProperties",
    "propertyNames", "minProperties", "items", "minItems", "maxItems", "uniqueItems", "pattern",
    "maxLength", "minimum", "maximum", "exclusiveMinimum", "if", "then",
}  # fmt: skip


def keywords(schema: Any) -> Iterator[str]:
    """Every keyword used anywhere in ``schema``."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield key
            if key in ("properties", "$defs"):
                for sub in value.values():
                    yield from keywords(sub)
            elif key in ("items", "additionalProperties", "propertyNames", "if", "then"):
                yield from keywords(value)


def _type_ok(value: Any, name: str) -> bool:
    match name:
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "boolean":
            return isinstance(value, bool)
        case "null":
            return value is None
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "integer":
            if isinstance(value, bool):
                return False
            return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        case _:
            raise ValueError(f"unknown type {name}")


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


class Validator:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def errors(self, instance: Any) -> list[str]:
        return list(self._check(self.root, instance, "$"))

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#/"):
            raise ValueError(f"only local refs are supported: {ref}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part]
        return node

    def _check(self, schema: Any, value: Any, path: str) -> Iterator[str]:
        if schema is True:
            return
        if schema is False:
            yield f"{path}: not allowed"
            return
        unknown = set(schema) - SUPPORTED
        if unknown:
            raise ValueError(f"unsupported keywords {unknown}")
        if "$ref" in schema:
            yield from self._check(self._resolve(schema["$ref"]), value, path)
        if "type" in schema and not _type_ok(value, schema["type"]):
            yield f"{path}: not of type {schema['type']}"
            return
        if "const" in schema and not _json_equal(value, schema["const"]):
            yield f"{path}: not {schema['const']!r}"
        if "enum" in schema and not any(_json_equal(value, e) for e in schema["enum"]):
            yield f"{path}: not one of {schema['enum']}"
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                yield f"{path}: too long"
            if "pattern" in schema and not re.search(schema["pattern"], value):
                yield f"{path}: does not match {schema['pattern']}"
        if _type_ok(value, "number"):
            if "minimum" in schema and value < schema["minimum"]:
                yield f"{path}: below minimum"
            if "maximum" in schema and value > schema["maximum"]:
                yield f"{path}: above maximum"
            if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
                yield f"{path}: not above exclusiveMinimum"
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                yield f"{path}: too few items"
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                yield f"{path}: too many items"
            if schema.get("uniqueItems"):
                for i, a in enumerate(value):
                    if any(_json_equal(a, b) for b in value[i + 1 :]):
                        yield f"{path}: items not unique"
                        break
            if "items" in schema:
                for i, item in enumerate(value):
                    yield from self._check(schema["items"], item, f"{path}[{i}]")
        if isinstance(value, dict):
            if "minProperties" in schema and len(value) < schema["minProperties"]:
                yield f"{path}: too few properties"
            for key in schema.get("required", []):
                if key not in value:
                    yield f"{path}: missing {key}"
            props = schema.get("properties", {})
            for key, item in value.items():
                if "propertyNames" in schema:
                    yield from self._check(schema["propertyNames"], key, f"{path}.<{key}>")
                if key in props:
                    yield from self._check(props[key], item, f"{path}.{key}")
                elif "additionalProperties" in schema:
                    yield from self._check(schema["additionalProperties"], item, f"{path}.{key}")
        if "if" in schema and "then" in schema and not list(self._check(schema["if"], value, path)):
            yield from self._check(schema["then"], value, path)

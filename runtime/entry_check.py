"""The edgekit metadata entry of a model file checked before anything reads it: limits first (size,
nesting, NaN/Infinity), then the entry against its own JSON Schema (edgekit/schemas/metadata-1.schema.json).

A model file is data from anywhere. What the runtime acts on (`mode`, `io`, `preprocessing`, `inputs`,
`outputs`) must be valid or the file is refused (ModelFormatError, exit 3); anything else that is invalid
(labels, delegate hints, the conversion records) is dropped with a warning and the model stays usable.

The runtime validates with the few JSON Schema keywords the schema uses, implemented here (the
`jsonschema` package is not a runtime dependency: it and its Rust extension are heavy for a Pi); the
tests check that the schema uses no other keyword and that `jsonschema` itself agrees on every case.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

from edgekit.errors import EdgekitError, ModelFormatError, one_line
from edgekit.runtime.preprocess import PreprocessSpec

MAX_ENTRY_BYTES = 16 * 1024**2
MAX_DEPTH = 32
MAX_RESIZE_PIXELS = 1 << 25  # what preprocessing may ask an image to be resized to: 33.5 MP (4K is 8.3)
# what the runtime acts on: invalid here means the model would run wrongly, so the file is refused
ACTED_ON = ("mode", "io", "preprocessing", "inputs", "outputs")
KEYWORDS = frozenset({"$schema", "$id", "title", "description", "type", "enum", "const", "properties", "required",
                      "additionalProperties", "items", "minItems", "maxItems", "minimum", "maximum", "pattern",
                      "maxLength", "dependentRequired", "$ref"})
REF_PREFIX = "urn:edgekit:schema:"  # `$ref`s name another edgekit schema by its `$id` (`urn:edgekit:schema:bench-1`)


class _NonFinite(str):
    """NaN or Infinity in the JSON text: Python's json reads them as floats, the schema never allows them."""


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return _schema_file("metadata-1")


@functools.lru_cache(maxsize=4)
def _schema_file(name: str) -> dict[str, Any]:
    return json.loads((resources.files("edgekit") / "schemas" / f"{name}.schema.json").read_text("utf-8"))


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    """`node` with its `$ref` (`urn:edgekit:schema:NAME#/json/pointer`, one of the schemas shipped beside this
    one) replaced by what it points at; the node's own keywords (a description) stay."""
    ref = node.get("$ref")
    if ref is None:
        return node
    name, _, pointer = ref.partition("#")
    if not name.startswith(REF_PREFIX):
        raise ValueError(f"the schema refers to {ref!r}, not to one of edgekit's schemas")
    target = _schema_file(name[len(REF_PREFIX):])
    for part in filter(None, pointer.split("/")):
        target = target[part.replace("~1", "/").replace("~0", "~")]
    return {**_resolved(target), **{k: v for k, v in node.items() if k != "$ref"}}


def parse(raw: bytes) -> Any:
    """The entry's JSON, within the size and nesting limits; NaN and Infinity stay visible as _NonFinite."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise ModelFormatError(f"edgekit metadata is {len(raw)} bytes, more than the {MAX_ENTRY_BYTES} an entry may be")
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_NonFinite)
    except RecursionError:
        raise ModelFormatError(f"edgekit metadata is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # not UTF-8, not JSON, an integer of over 4,300 digits
        raise ModelFormatError(f"edgekit metadata is not valid JSON ({one_line(exc)[:200]})") from None
    if json_depth(value) > MAX_DEPTH:
        raise ModelFormatError(f"edgekit metadata is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(value, dict):
        raise ModelFormatError("edgekit metadata is not a JSON object")
    return value


def json_depth(value: Any, stop: int = MAX_DEPTH) -> int:
    """How deeply `value` (parsed JSON) nests, counted without recursion; counting stops past `stop`."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        value, level = todo.pop()
        deepest = max(deepest, level)
        if deepest > stop:
            break
        if isinstance(value, dict):
            todo.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, level + 1) for v in value)
    return deepest


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, _NonFinite):
        return False
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":  # and valid Unicode: a lone surrogate cannot be printed (or drawn: cv2.putText crashed)
        return isinstance(value, str) and _encodable(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "integer":  # JSON Schema 2020-12: 3.0 is an integer
        return isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())
    return kind == "number"


def problems(value: Any, node: dict[str, Any], path: str = "") -> Iterator[str]:
    """Each way `value` breaks `node` (a schema), as "path: what"."""
    where = path or "entry"
    node = _resolved(node)
    if isinstance(value, _NonFinite):
        yield f"{where}: {value} is not a number JSON allows"
        return
    if "const" in node and not _same(value, node["const"]):
        yield f"{where}: must be {node['const']!r}"
    if "enum" in node and not any(_same(value, e) for e in node["enum"]):
        yield f"{where}: {_short(value)} is not one of {', '.join(map(repr, node['enum']))}"
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not any(_is_type(value, k) for k in kinds):
            yield f"{where}: {_short(value)} is not {' or '.join(kinds)}"
            return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            yield f"{where}: {value} is below {node['minimum']}"
        if "maximum" in node and value > node["maximum"]:
            yield f"{where}: {value} is above {node['maximum']}"
    if isinstance(value, str):
        if "maxLength" in node and len(value) > node["maxLength"]:
            yield f"{where}: a string of {len(value)} characters, more than {node['maxLength']}"
        if "pattern" in node and not re.search(_ecma(node["pattern"]), value):
            yield f"{where}: {_short(value)} does not match {node['pattern']}"
    if isinstance(value, list):
        if "minItems" in node and len(value) < node["minItems"]:
            yield f"{where}: {len(value)} items, fewer than {node['minItems']}"
        if "maxItems" in node and len(value) > node["maxItems"]:
            yield f"{where}: {len(value)} items, more than {node['maxItems']}"
        if isinstance(node.get("items"), dict):
            for i, item in enumerate(value):
                yield from problems(item, node["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        yield from _object_problems(value, node, path)


def _object_problems(value: dict, node: dict[str, Any], path: str) -> Iterator[str]:
    for key in node.get("required", ()):
        if key not in value:
            yield f"{path + '.' if path else ''}{key}: missing"
    for key, needs in node.get("dependentRequired", {}).items():
        for need in needs if key in value else ():
            if need not in value:
                yield f"{path + '.' if path else ''}{need}: missing (it goes with {key})"
    props = node.get("properties", {})
    extra = node.get("additionalProperties", True)
    for key, item in value.items():
        sub = f"{path}.{key}" if path else str(key)
        if key in props:
            yield from problems(item, props[key], sub)
        elif extra is False:
            yield f"{sub}: not a key the schema has"
        elif isinstance(extra, dict):
            yield from problems(item, extra, sub)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _ecma(pattern: str) -> str:
    """A JSON Schema (ECMA-262) pattern for Python's re: a final `$` matches only at the very end."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1 and "1" is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_entry(raw: bytes) -> tuple[dict[str, Any], list[str]]:
    """(the entry to use, warnings). ModelFormatError when it breaks the limits, is not an object, or a key
    the runtime acts on is invalid; other invalid keys are left out of the entry, each with a warning.
    Keys the entry lacks stay absent (files from older edgekit versions, hand-written entries)."""
    entry = parse(raw)
    props = schema()["properties"]
    kept, warnings = {}, []
    for key, value in entry.items():
        found = list(problems(value, props[key], key)) if key in props else []
        if not found:
            if not isinstance(value, _NonFinite):
                kept[key] = value
            else:
                warnings.append(f"edgekit metadata {key}: {value} is not a number JSON allows; ignored")
            continue
        if key in ACTED_ON:
            raise ModelFormatError(f"edgekit metadata is invalid: {found[0]}")
        warnings.append(f"edgekit metadata {found[0]}; {key} ignored")
    for where, spec in _preprocessing(kept):
        found = list(problems(spec, props["preprocessing"], where)) if where != "preprocessing" else []
        if found:
            raise ModelFormatError(f"edgekit metadata is invalid: {found[0]}")
        if not all(isinstance(spec.get(k), int) for k in ("height", "width")):
            raise ModelFormatError(f"edgekit metadata is invalid: {where} height and width must be integers")
        try:  # what the runtime will build from it: channels and mean/std agree, std is not 0, all finite
            PreprocessSpec.from_dict(spec)
        except (EdgekitError, ValueError, TypeError, OverflowError) as exc:
            why = re.sub(r"--([a-z][a-z-]*)", r"\1", one_line(exc))  # its field, not the convert flag
            raise ModelFormatError(f"edgekit metadata is invalid: {where}: {why}") from None
        if spec["height"] * spec["width"] > MAX_RESIZE_PIXELS:
            raise ModelFormatError(f"edgekit metadata is invalid: {where} asks for {spec['height']}x{spec['width']} "
                                   f"images, more than {MAX_RESIZE_PIXELS} pixels")
    return kept, warnings


def _preprocessing(entry: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(entry.get("preprocessing"), dict):
        yield "preprocessing", entry["preprocessing"]
    for i, tensor in enumerate(entry.get("inputs") or ()):
        if isinstance(tensor.get("preprocessing"), dict) and {"height", "width"} <= set(tensor["preprocessing"]):
            yield f"inputs[{i}].preprocessing", tensor["preprocessing"]

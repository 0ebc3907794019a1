"""The JSON contracts edgekit emits, as JSON Schema files (draft 2020-12) in edgekit/schemas/.

`load_schema("edgekit.bench/1")` reads one; `validate(document)` checks a document against the schema
its `schema` key names. Validation needs the `jsonschema` package (a dev dependency, not a runtime one).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from edgekit.errors import MissingDependencyError

# schema string -> file in edgekit/schemas/
SCHEMAS = {
    "edgekit.bench/1": "bench-1.schema.json",
    "edgekit.inspect/1": "inspect-1.schema.json",
    "edgekit.doctor/1": "doctor-1.schema.json",
    "edgekit.sweep/1": "sweep-1.schema.json",
    "edgekit.tune/1": "tune-1.schema.json",
    "edgekit.metadata/1": "metadata-1.schema.json",
}


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one contract, e.g. load_schema("edgekit.bench/1")."""
    if name not in SCHEMAS:
        raise ValueError(f"unknown contract {name!r}; known: {', '.join(SCHEMAS)}")
    return json.loads(resources.files("edgekit").joinpath("schemas").joinpath(SCHEMAS[name]).read_text("utf-8"))


def validate(document: dict[str, Any], name: str | None = None) -> None:
    """Raise jsonschema.ValidationError (the most relevant error) when `document` breaks its contract;
    `name` defaults to the document's own `schema` key. The schemas refer to one another by `$id`."""
    if name is None:
        name = document.get("schema") if isinstance(document, dict) else None
        if not isinstance(name, str):
            raise ValueError("the document has no `schema` key naming its contract; pass name=")
    schema = load_schema(name)
    try:
        import jsonschema
        from referencing import Registry, Resource
    except ImportError:
        raise MissingDependencyError("validating edgekit JSON contracts needs jsonschema>=4.18: "
                                     "pip install 'jsonschema>=4.18'") from None
    registry = Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in (load_schema(n) for n in SCHEMAS))
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        raise error

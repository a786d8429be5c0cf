"""`enum`/`const` beside other keywords: the listed values that validate, decided by the validator itself.

The compiler reads `{"enum": [...], "not": {...}}` as L(enum) ∩ ¬U(not), and where U cannot tell the values apart
(`patternProperties`, `oneOf`, `additionalProperties` under a `not`) the language comes out empty. A finite list
needs no approximation: each value is checked against the whole subschema by `jsonschema` (formats asserted, so
never looser than a validator that checks them), and the subschema becomes the `enum` of the values that pass.
The compiler holds subschemas in 2020-12's vocabulary with their dialect's meaning (`fsm.dialects.read`), so a value
must pass both the 2020-12 validator and the dialect's own: each keyword is enforced by one of them as it is meant.
The `enum` being filtered is left out of what checks its own values (each equals itself): asking it made a list of n
values n² comparisons (5,383 region codes beside `"type": "string"`: 23 s of a compile).
Validity follows the value, not its spelling, except draft-04's integers (1.0 is none there): that dialect, a
subschema with a `$ref` (its base may be another resource's) and documents that switch dialects keep the compiler's
own reading.
"""

from __future__ import annotations

import jsonschema

VALIDATORS = {"draft-04": jsonschema.Draft4Validator, "draft-06": jsonschema.Draft6Validator,
              "draft-07": jsonschema.Draft7Validator, "2019-09": jsonschema.Draft201909Validator,
              "2020-12": jsonschema.Draft202012Validator}
CONSTANTS = ("enum", "const")


def valid_constants(schema, dialect: str, keywords) -> list | None:
    """The values of `schema`'s enum/const that validate against all of `schema`; None where the filter does not
    apply (no other validation keyword among `keywords`, a `$ref` inside, draft-04, or jsonschema fails)."""
    if not isinstance(schema, dict) or not any(k in schema for k in CONSTANTS) or dialect == "draft-04":
        return None
    if not any(k in schema for k in keywords if k not in CONSTANTS) or _has_ref(schema):
        return None
    values = [schema["const"]] if "const" in schema else schema["enum"]
    if not isinstance(values, list) or not values:
        return None
    classes = {VALIDATORS["2020-12"], VALIDATORS.get(dialect, VALIDATORS["2020-12"])}
    checked = schema if "const" in schema else _without_own_enum(schema)
    try:
        validators = [cls(checked, format_checker=cls.FORMAT_CHECKER) for cls in classes]
        return [value for value in values if all(v.is_valid(value) for v in validators)]
    except Exception:  # noqa: BLE001 (whatever jsonschema cannot check, the compiler reads as before)
        return None


def _without_own_enum(schema: dict) -> dict:
    """`schema` less the `enum` whose values are being checked: every value of a list equals itself, so the keyword
    passes them all, and asking it costs one comparison per listed value for each (5,383 region codes: 29M)."""
    return {k: v for k, v in schema.items() if k != "enum"}


def _has_ref(node) -> bool:
    if isinstance(node, dict):
        return any(k in node for k in ("$ref", "$dynamicRef", "$recursiveRef")) or any(map(_has_ref, node.values()))
    return isinstance(node, list) and any(map(_has_ref, node))

"""`$schema` -> the dialect whose semantics the guide applies, and each subschema read in that dialect.

The compiler speaks draft 2020-12's vocabulary. `read` turns a subschema of any supported dialect into
that vocabulary, keeping only what the dialect defines (a keyword it does not define is an annotation
there, even under `not`), so every later step applies the declared dialect's semantics:

- draft-04: `exclusiveMinimum`/`exclusiveMaximum` are booleans that make `minimum`/`maximum` exclusive
  (read as the numeric form); `type: integer` excludes 1.0 (marked `WHOLE_INTEGERS` for the compiler).
- draft-04/06/07: every keyword beside `$ref` is ignored; `items` as an array is `prefixItems`, with
  `additionalItems` as the rest; `dependencies` holds both required names and schemas.
- 2019-09: as 2020-12, but `items` may still be an array (with `additionalItems`); no `prefixItems`.
- No `$schema`: draft 2020-12, where the legacy `dependencies` and array-form `items`/`additionalItems`
  still apply with their draft-07 meaning (they only narrow what is generated, as they did before).
An unknown `$schema` raises `SchemaError` naming it: its semantics cannot be known. A subschema that declares
another dialect is read in it, as validators do (`_nested`, `dialect_at`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from urllib.parse import unquote

from fsm.errors import SchemaError

DIALECTS = ("draft-04", "draft-06", "draft-07", "2019-09", "2020-12")
_URI = re.compile(r"https?://json-schema\.org/(draft-0[467]|draft/2019-09|draft/2020-12)/schema#?")
_COMMON = frozenset("type enum multipleOf maximum minimum maxLength minLength pattern format maxItems minItems "
                    "uniqueItems maxProperties minProperties required properties patternProperties "
                    "additionalProperties items allOf anyOf oneOf not $ref".split())
_D4 = _COMMON | {"additionalItems", "dependencies", "exclusiveMinimum", "exclusiveMaximum"}
_D6 = _D4 | {"const", "contains", "propertyNames"}
_D7 = _D6 | {"if", "then", "else"}
_D2019 = (_D7 - {"dependencies"}) | {"dependentRequired", "dependentSchemas", "minContains", "maxContains",
                                     "unevaluatedProperties", "unevaluatedItems", "$recursiveRef"}
_D2020 = (_D2019 - {"additionalItems", "$recursiveRef"}) | {"prefixItems", "$dynamicRef"}
KEYWORDS = {"draft-04": _D4, "draft-06": _D6, "draft-07": _D7, "2019-09": _D2019, "2020-12": _D2020}
_LEGACY = _D2020 | {"dependencies", "additionalItems", "$recursiveRef"}  # no $schema: 2020-12 plus these
_EXCLUSIVE = (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum"))
CANONICAL = {"draft-04": "http://json-schema.org/draft-04/schema", "draft-06": "http://json-schema.org/draft-06/schema",
             "draft-07": "http://json-schema.org/draft-07/schema", "2019-09": "https://json-schema.org/draft/2019-09/schema",
             "2020-12": "https://json-schema.org/draft/2020-12/schema"}  # each meta-schema's own id
# added beside a draft-04 `type` with "integer": no 1.0 (not a JSON Schema keyword)
WHOLE_INTEGERS = "fsm:wholeIntegers"
_DATA = frozenset("enum const default examples".split())


@dataclass(frozen=True)
class Dialect:
    """The JSON Schema dialect of one schema document (`declared`: named by its `$schema`)."""

    name: str
    declared: bool = True

    @property
    def keywords(self) -> frozenset:
        """The validation keywords the dialect defines (the others are annotations)."""
        return KEYWORDS[self.name] if self.declared else _LEGACY

    @cached_property
    def places(self) -> frozenset:
        """The keywords whose values are subschemas, where an `$id` names a resource (`definitions` in every
        dialect, as its meta-schemas keep it; `$defs` from 2019-09): an `$id` anywhere else is plain data."""
        return frozenset((self.keywords & _SUBSCHEMAS) | {"definitions"} | (set() if self.legacy else {"$defs"}))

    @property
    def legacy(self) -> bool:
        """Draft-04, -06 or -07: `$ref` replaces its object, anchors are spelled `"$id": "#name"`."""
        return self.name.startswith("draft-")

    @property
    def id_keyword(self) -> str:
        return "id" if self.name == "draft-04" else "$id"

    @property
    def fraction_integers(self) -> bool:
        """Whether 1.0 is an integer (draft-06 on; in draft-04 an integer has no fraction or exponent)."""
        return self.name != "draft-04"

    @property
    def dollar_anchors(self) -> bool:
        return not self.legacy

    @property
    def id_anchors(self) -> bool:
        """Whether `"$id": "#name"` (draft-04: `"id"`) names a plain-name fragment."""
        return self.legacy or not self.declared


DEFAULT = Dialect("2020-12", declared=False)


def dialect_of(schema) -> Dialect:
    """The dialect `schema`'s `$schema` names (none: 2020-12); SchemaError for one the guide does not know."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return DEFAULT
    return Dialect(_name(schema["$schema"], "#"))


def schema_dialect(schema) -> str:
    """The name of the dialect the guide reads `schema` in.

    Parameters
    ----------
    schema : pydantic model class, dict, bool or str
        As `fsm.compile_schema` takes it (a pydantic model's schema is 2020-12).

    Returns
    -------
    str
        One of `DIALECTS`: "draft-04", "draft-06", "draft-07", "2019-09" or "2020-12" (no `$schema`).

    Raises
    ------
    SchemaError
        For a `$schema` that names no dialect the guide knows (the error names it), or a schema that is not JSON.
    """
    return dialect_of(as_dict(schema)).name


def as_dict(schema) -> dict | bool:
    """The JSON Schema of a pydantic model class, a dict or a JSON string (SchemaError for anything else)."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise SchemaError(f"schema is not valid JSON: {error}") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(
            f"a schema must be a pydantic model class, a dict or a JSON string, not {type(schema).__name__}"
        )
    return schema


def dialect_at(root, pointer: str, dialect: Dialect) -> Dialect:
    """The dialect in effect at `pointer` ("#/a/b"): the last `$schema` on the way there, the node's own
    included (spelled as its meta-schema's own URI: the ones validators switch on), else the root's `dialect`."""
    node = root
    for part in [p for p in pointer[1:].split("/") if p] if pointer.startswith("#/") else []:
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) and key.isdigit() and int(key) < len(node) else \
            node.get(key) if isinstance(node, dict) else None
        name = _switch(node.get("$schema")) if isinstance(node, dict) else None
        dialect = Dialect(name) if name is not None else dialect
    return dialect


def declared(root) -> set[str]:
    """The dialects `root` and its subschemas declare (known spellings of them)."""
    found, stack = set(), [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            found.add(_known(node.get("$schema")))
            stack.extend(v for k, v in node.items() if k not in _DATA)
    return found - {None}


def _known(uri) -> str | None:
    """The dialect a `$schema` value names, None when it is not a known spelling."""
    found = _URI.fullmatch(uri) if isinstance(uri, str) else None
    return found.group(1).removeprefix("draft/") if found else None


def _switch(uri) -> str | None:
    """The dialect a subschema's `$schema` switches to: spelled as the meta-schema's own URI, as validators read it."""
    name = _known(uri)
    return name if name is not None and uri.rstrip("#") == CANONICAL[name] else None


def _name(uri, pointer: str) -> str:
    name = _known(uri)
    if name is None:
        raise SchemaError(f"unknown dialect {uri!r}: the guide reads draft-04, draft-06, draft-07, 2019-09 and "
                          "2020-12 (json-schema.org meta-schema URIs, http or https, with or without '#'); "
                          "leave $schema out for 2020-12", keyword="$schema", pointer=pointer)
    return name


def read(node, dialect: Dialect, pointer: str):
    """`node` in draft 2020-12's vocabulary with `dialect`'s semantics (subschemas read too; `$ref`s as they are)."""
    if not isinstance(node, dict):
        return node
    if pointer != "#" and "$schema" in node:
        dialect = _nested(node, dialect, pointer)
    if "$ref" in node and dialect.legacy:  # draft-07 core 8.3: all other properties are ignored
        return {"$ref": node["$ref"]}
    out = {k: v for k, v in node.items() if k in dialect.keywords}
    if not dialect.fraction_integers and "integer" in _types(out.get("type")):
        out[WHOLE_INTEGERS] = True
    _exclusive(out, dialect, pointer)
    _items(out, dialect, pointer)
    return {k: _children(k, v, dialect, f"{pointer}/{_escape(k)}") for k, v in out.items()}


def _nested(node: dict, dialect: Dialect, pointer: str) -> Dialect:
    """The dialect of a subschema that declares one: validators switch to it there (jsonschema reads every
    subschema's `$schema`), so the guide does too. Refused: a spelling validators may not know there (only the
    meta-schema's own URI, with or without '#'), and a switch at or above identifiers, which the guide
    resolves by the root's rules."""
    uri = node["$schema"]
    name = _name(uri, pointer)
    if name == dialect.name:
        return dialect
    if _switch(uri) is None:
        raise SchemaError(f"a subschema's $schema must be spelled {CANONICAL[name]!r} to switch dialects, not "
                          f"{uri!r}", keyword="$schema", pointer=pointer)
    if _has_identifiers(node):
        raise SchemaError(f"a subschema switches from {dialect.name} to {name} around an identifier ($id, id or "
                          "$anchor), which is not supported", keyword="$schema", pointer=pointer)
    return Dialect(name)


def _has_identifiers(node) -> bool:
    if isinstance(node, list):
        return any(_has_identifiers(v) for v in node)
    if not isinstance(node, dict):
        return False
    if any(isinstance(node.get(k), str) for k in ("$id", "id", "$anchor")):
        return True
    return any(_has_identifiers(v if k not in _MAPS | {"definitions", "$defs"} or not isinstance(v, dict)
                                else list(v.values())) for k, v in node.items() if k not in _DATA)


def _types(value) -> list:
    return [value] if isinstance(value, str) else value if isinstance(value, list) else []


def _exclusive(out: dict, dialect: Dialect, pointer: str) -> None:
    """Draft-04's boolean flags -> the numeric form; booleans elsewhere (and numbers in draft-04) are refused."""
    for flag, bound in _EXCLUSIVE:
        if flag not in out:
            continue
        value = out[flag]
        if dialect.name != "draft-04":
            if isinstance(value, bool):
                raise SchemaError(
                    f"must be a number in {dialect.name}; a boolean is draft-04's form (declare "
                    '"$schema": "http://json-schema.org/draft-04/schema#")',
                    keyword=flag,
                    pointer=pointer,
                )
            continue
        if not isinstance(value, bool):
            raise SchemaError(f"must be a boolean in draft-04 (it makes {bound} exclusive), not {value!r}",
                              keyword=flag, pointer=pointer)
        del out[flag]
        if value and isinstance(out.get(bound), (int, float)) and not isinstance(out[bound], bool):
            out[flag] = out.pop(bound)


def _items(out: dict, dialect: Dialect, pointer: str) -> None:
    """Array-form `items` -> `prefixItems`, `additionalItems` -> `items`; `additionalItems` alone is ignored."""
    rest = out.pop("additionalItems", None)
    if not isinstance(out.get("items"), list):
        return
    if dialect.declared and dialect.name == "2020-12":
        raise SchemaError("must be a schema in 2020-12 (the array form is 2019-09's and earlier: use prefixItems)",
                          keyword="items", pointer=pointer)
    out["prefixItems"] = out.pop("items")
    if rest is not None:
        out["items"] = rest


_ONE = frozenset("not if then else items additionalProperties propertyNames contains unevaluatedItems "
                 "unevaluatedProperties".split())
_LISTS = frozenset("allOf anyOf oneOf prefixItems".split())
_MAPS = frozenset("properties patternProperties dependentSchemas dependencies".split())
_SUBSCHEMAS = _ONE | _LISTS | _MAPS | {"additionalItems"}


def _children(keyword: str, value, dialect: Dialect, pointer: str):
    if keyword in _ONE:
        return read(value, dialect, pointer)
    if keyword in _LISTS and isinstance(value, list):
        return [read(v, dialect, f"{pointer}/{i}") for i, v in enumerate(value)]
    if keyword in _MAPS and isinstance(value, dict):
        return {k: read(v, dialect, f"{pointer}/{_escape(k)}") for k, v in value.items()}
    return value


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")

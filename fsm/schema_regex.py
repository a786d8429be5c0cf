"""Transitional (deleted once Guide.from_rx lands): JSON Schema (or a pydantic model) -> a regex whose matches are exactly valid, compact JSON.

Policies (all documented in the README):
- Whitespace: compact JSON by default (`{"a":1}`), because it leaves the most forced tokens; pass
  `whitespace=r"[ \\n]?"` (any regex) to allow whitespace between JSON tokens.
- Properties are written in schema order; optional ones may be left out. `additionalProperties`
  absent means closed objects (only the listed properties) unless `additional_properties=True`.
- `$ref` recursion is unrolled `max_recursion_depth` times; deeper alternatives are left out.
  Free-form values (`{}`, `true`, open additional properties) nest at most as deep.
- Strings with `pattern` or `format` are written without escape sequences.
The generated language is always a subset of the valid instances: a keyword the regex cannot
enforce raises `SchemaError` naming it and its JSON pointer, never silently ignored.
"""

from __future__ import annotations

import json
import re

from fsm import json_regex as jr
from fsm.errors import RegexError, SchemaError
from fsm.merge import merge_all, resolve_pointer
from fsm.patterns_regex import pattern_content, pattern_min_length

ANNOTATIONS = frozenset(
    "title description examples default $schema $id id $comment deprecated readOnly writeOnly $anchor "
    "contentMediaType contentEncoding contentSchema discriminator $defs definitions nullable".split()
)
UNSUPPORTED = frozenset(
    "not if then else patternProperties dependentRequired dependentSchemas dependencies contains "
    "minContains maxContains propertyNames unevaluatedProperties unevaluatedItems $dynamicRef "
    "$recursiveRef minProperties maxProperties".split()
)
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
TYPE_KEYWORDS["integer"] = TYPE_KEYWORDS["number"]
ALL_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class _TooDeep(Exception):
    """A $ref went deeper than max_recursion_depth; the enclosing optional part is left out."""


def regex_from_schema(
    schema, *, whitespace: str = "", additional_properties: bool = False, max_recursion_depth: int = 3
) -> str:
    """Regex for the compact JSON texts that validate against `schema`.

    Parameters
    ----------
    schema : pydantic model class, dict or str
        A pydantic ``BaseModel`` subclass, a JSON Schema dict, or a JSON Schema as a JSON string.
    whitespace : str
        Regex allowed between JSON tokens ("" = compact JSON, the default).
    additional_properties : bool
        How to read objects that do not say ``additionalProperties``: False (default) allows only the
        listed properties, True also allows further keys with any JSON value.
    max_recursion_depth : int
        How many times a recursive ``$ref`` is unrolled.

    Raises
    ------
    SchemaError
        For an invalid schema or a keyword the regex cannot enforce; the message names the keyword
        and its JSON pointer.
    """
    root = _as_dict(schema)
    compiler = _Compiler(root, whitespace, additional_properties, max_recursion_depth)
    try:
        return compiler.compile(root, "#")
    except _TooDeep:
        raise SchemaError("recursion deeper than max_recursion_depth", keyword="$ref", pointer="#") from None


def _as_dict(schema) -> dict | bool:
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise SchemaError(f"schema is not valid JSON: {error}") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a schema must be a pydantic model class, a dict or a JSON string, not {type(schema).__name__}")
    return schema


class _Compiler:
    def __init__(self, root, whitespace: str, additional_properties: bool, max_depth: int):
        self.root, self.ws, self.open_objects, self.max_depth = root, whitespace, additional_properties, max_depth
        self.ref_depth: dict[str, int] = {}
        self.any_depth = 0

    def compile(self, schema, pointer: str) -> str:
        if schema is True or schema == {}:
            return self.any_value(pointer)
        if schema is False:
            raise SchemaError("the schema `false` accepts no value", keyword="false", pointer=pointer)
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}", pointer=pointer)
        _check_keywords(schema, pointer)
        if "$ref" in schema:
            return self.ref(schema, pointer)
        if "allOf" in schema:
            return self.compile(merge_all(schema, pointer, self.resolve), pointer)
        if "anyOf" in schema or "oneOf" in schema:
            return self.union(schema, pointer)
        if "enum" in schema or "const" in schema:
            return self.constants(schema, pointer)
        return self.typed(schema, pointer)

    # -- references and combinators -------------------------------------------------------------

    def resolve(self, ref: str, pointer: str):
        return resolve_pointer(self.root, ref, pointer)

    def ref(self, schema: dict, pointer: str) -> str:
        ref = schema["$ref"]
        target = self.resolve(ref, pointer)
        siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
        if siblings:
            return self.compile({"allOf": [target, siblings]}, pointer)
        depth = self.ref_depth.get(ref, 0)
        if depth >= self.max_depth:
            raise _TooDeep(ref)
        self.ref_depth[ref] = depth + 1
        try:
            return self.compile(target, ref)
        finally:
            self.ref_depth[ref] = depth

    def union(self, schema: dict, pointer: str) -> str:
        keyword = "anyOf" if "anyOf" in schema else "oneOf"
        options = schema[keyword]
        if not isinstance(options, list) or not options:
            raise SchemaError("must be a non-empty array of schemas", keyword=keyword, pointer=pointer)
        base = {k: v for k, v in schema.items() if k != keyword}
        alternatives = []
        for i, option in enumerate(options):
            merged = {"allOf": [base, option]} if _has_constraints(base) else option
            try:
                alternatives.append(self.compile(merged, f"{pointer}/{keyword}/{i}"))
            except _TooDeep:
                continue
        if not alternatives:
            raise _TooDeep(pointer)
        if keyword == "oneOf":
            _check_exclusive(alternatives, pointer)
        return _alternation(alternatives)

    def constants(self, schema: dict, pointer: str) -> str:
        keyword = "const" if "const" in schema else "enum"
        values = [schema["const"]] if keyword == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError("must be a non-empty array", keyword=keyword, pointer=pointer)
        rest = {k: v for k, v in schema.items() if k != keyword}  # the other keywords filter the values
        check = re.compile(self.compile(rest, pointer)) if _has_constraints(rest) else None
        kept = [jr.literal(v) for v in values]
        kept = [r for r, v in zip(kept, values) if check is None or check.fullmatch(_compact(v))]
        if not kept:
            raise SchemaError("no listed value satisfies the other keywords", keyword=keyword, pointer=pointer)
        return _alternation(list(dict.fromkeys(kept)))

    # -- types ------------------------------------------------------------------------------------

    def typed(self, schema: dict, pointer: str) -> str:
        types = schema.get("type")
        if types is None:
            implied = [t for t in ALL_TYPES if TYPE_KEYWORDS.get(t, set()) & schema.keys()]
            types = implied or list(ALL_TYPES)
        types = [types] if isinstance(types, str) else types
        unknown = [t for t in types if t not in ALL_TYPES]
        if unknown or not types:
            raise SchemaError(f"unknown type {unknown[0] if unknown else types!r}", keyword="type", pointer=pointer)
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        return _alternation([getattr(self, f"type_{t}")(schema, pointer) for t in types])

    def any_value(self, pointer: str) -> str:
        """Any JSON value; free-form arrays and objects nest at most max_recursion_depth deep."""
        if self.any_depth >= self.max_depth:
            return _alternation([jr.STRING, jr.NUMBER, jr.BOOLEAN, jr.NULL])
        self.any_depth += 1
        try:
            return self.typed({}, pointer)
        finally:
            self.any_depth -= 1

    def type_null(self, schema, pointer) -> str:
        return jr.NULL

    def type_boolean(self, schema, pointer) -> str:
        return jr.BOOLEAN

    def type_integer(self, schema, pointer) -> str:
        _check_multiple_of(schema, pointer, integer=True)
        low, high = jr.integer_bounds(_numeric_bounds(schema, pointer))
        return _nonempty(jr.integer_range(low, high), "minimum", pointer)

    def type_number(self, schema, pointer) -> str:
        _check_multiple_of(schema, pointer, integer=False)
        bounds = _numeric_bounds(schema, pointer)
        if not bounds:
            return jr.NUMBER
        low, low_open = _bound(bounds, "minimum", "exclusiveMinimum", pointer)
        high, high_open = _bound(bounds, "maximum", "exclusiveMaximum", pointer)
        return _nonempty(jr.number_range(low, high, low_open, high_open), "minimum", pointer)

    def type_string(self, schema, pointer) -> str:
        low = _natural(schema, "minLength", pointer, 0)
        high = _natural(schema, "maxLength", pointer, None)
        lookaheads = []
        patterns = schema.get("pattern", [])
        for p in patterns if isinstance(patterns, list) else [patterns]:  # a list after allOf merging
            lookaheads.append(pattern_content(p, pointer))
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in jr.FORMATS:
                raise SchemaError(f"format {fmt!r} is not supported (supported: {', '.join(jr.FORMATS)})", keyword="format", pointer=pointer)
            lookaheads.append(jr.FORMATS[fmt])
        low = max([low] + [pattern_min_length(r) for r in lookaheads])
        if high is not None and low > high:
            raise SchemaError(f"no string is between {low} and {high} characters long", keyword="maxLength", pointer=pointer)
        return jr.string_regex(low, high, lookaheads)

    def type_array(self, schema, pointer) -> str:
        prefix = schema.get("prefixItems", schema["items"] if isinstance(schema.get("items"), list) else [])
        rest = schema.get("additionalItems", True) if isinstance(schema.get("items"), list) else schema.get("items", True)
        low = _natural(schema, "minItems", pointer, 0)
        high = _natural(schema, "maxItems", pointer, None)
        if schema.get("uniqueItems") is True and (high is None or high > 1):
            raise SchemaError("uniqueItems cannot be enforced by a regular language", keyword="uniqueItems", pointer=pointer)
        items = [self.compile(s, f"{pointer}/prefixItems/{i}") for i, s in enumerate(prefix)]
        return self.sequence(items, rest, low, high, pointer)

    def sequence(self, prefix: list[str], rest, low: int, high: int | None, pointer: str) -> str:
        """`[p0,p1,...,r,r,...]` with low..high items: prefix items first, then `rest` items."""
        sep, n = f"{self.ws},{self.ws}", len(prefix)
        options = [sep.join(prefix[:count]) for count in range(low, n + 1) if high is None or count <= high]
        more_low, more_high = max(low - n, 1), None if high is None else high - n
        item = None if rest is False or more_high == 0 else self.optional(rest, f"{pointer}/items")
        if item is not None and (more_high is None or more_high > 0):
            upper = "" if more_high is None else more_high - 1
            options.append(sep.join(prefix + [f"{item}(?:{sep}{item}){{{more_low - 1},{upper}}}"]))
        if not options:
            raise SchemaError("no array length satisfies minItems/maxItems and items", keyword="minItems", pointer=pointer)
        return rf"\[{self.ws}{_alternation(options)}{self.ws}\]"

    def type_object(self, schema, pointer) -> str:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError("properties must be an object and required an array", keyword="properties", pointer=pointer)
        extra = schema.get("additionalProperties", self.open_objects)
        declared = dict(properties)
        for name in required:
            if name not in declared:
                if extra is False:
                    raise SchemaError(f"required property {name!r} is not allowed by additionalProperties", keyword="required", pointer=pointer)
                declared[name] = extra
        members = []
        for name, subschema in declared.items():
            value = self.optional(subschema, f"{pointer}/properties/{_escape_pointer(name)}")
            if value is None and name in required:
                raise _TooDeep(name)
            if value is not None:
                kind = "required" if name in required else "optional"
                members.append((f"{jr.literal(name)}{self.ws}:{self.ws}{value}", kind))
        if extra is not False:
            value = self.optional(extra, f"{pointer}/additionalProperties")
            if value is not None:
                members.append((f"{_key_not_in(list(declared))}{self.ws}:{self.ws}{value}", "repeated"))
        return self.members(members)

    def optional(self, schema, pointer: str) -> str | None:
        """The regex of a part that may be left out, or None if recursion is too deep there."""
        try:
            return self.compile(schema, pointer)
        except _TooDeep:
            return None

    def members(self, members: list[tuple[str, str]]) -> str:
        """`{...}` with members in order: "required", "optional" (0-1) or "repeated" (0+).

        Quadratic in the number of leading optional members, linear otherwise.
        """
        sep = f"{self.ws},{self.ws}"
        quantifier = {"optional": "?", "repeated": "*"}
        after = [""] * (len(members) + 1)  # after[i]: members i.. once an earlier one was written
        for i in range(len(members) - 1, -1, -1):
            regex, kind = members[i]
            one = f"{sep}{regex}" if kind == "required" else f"(?:{sep}{regex}){quantifier[kind]}"
            after[i] = one + after[i + 1]
        starts = []
        for i, (regex, kind) in enumerate(members):  # the first written member is i
            starts.append(regex + (f"(?:{sep}{regex})*" if kind == "repeated" else "") + after[i + 1])
            if kind == "required":
                break
        body = _alternation(starts) if starts else ""
        if starts and all(kind != "required" for _, kind in members):
            body = f"(?:{body})?"
        return rf"\{{{self.ws}{body}{self.ws}\}}"


def _key_not_in(names: list[str]) -> str:
    """A JSON key (no escapes) that differs from every name in `names`."""
    char = r'[^"\\\x00-\x1f]'
    trie: dict = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[""] = {}
    return f'"{_not_in_trie(trie, char)}"'


def _not_in_trie(node: dict, char: str) -> str:
    children = [c for c in node if c]
    options = [] if "" in node else [""]  # stopping here is fine unless a name ends here
    if children:
        others = "".join(re.escape(c) if c not in "]^-\\" else "\\" + c for c in children)
        options.append(f'[^"\\\\\\x00-\\x1f{others}]{char}*')
        options += [re.escape(c) + _not_in_trie(node[c], char) for c in children]
    else:
        options.append(f"{char}+")
    return _alternation(options)


def _check_keywords(schema: dict, pointer: str) -> None:
    for keyword in schema:
        if keyword in UNSUPPORTED:
            raise SchemaError("this keyword cannot be enforced by a regular language here", keyword=keyword, pointer=pointer)


def _has_constraints(schema: dict) -> bool:
    return any(k not in ANNOTATIONS for k in schema)


def _check_exclusive(alternatives: list[str], pointer: str) -> None:
    """oneOf equals anyOf only when no value matches two alternatives: prove it on the automata."""
    import interegular

    try:
        machines = [interegular.parse_pattern(a).to_fsm() for a in alternatives]
    except Exception:
        machines = None
    if machines is not None and all(
        machines[i].isdisjoint(machines[j]) for i in range(len(machines)) for j in range(i + 1, len(machines))
    ):
        return
    raise SchemaError("oneOf alternatives may overlap, so 'exactly one' cannot be enforced", keyword="oneOf", pointer=pointer)


def _check_multiple_of(schema: dict, pointer: str, integer: bool) -> None:
    step = schema.get("multipleOf")
    if step is None or (integer and step == 1) or (integer and isinstance(step, float) and (1 / step).is_integer()):
        return
    raise SchemaError(f"multipleOf {step} cannot be enforced", keyword="multipleOf", pointer=pointer)


def _numeric_bounds(schema: dict, pointer: str) -> dict:
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    bounds = {k: schema[k] for k in keys if k in schema}
    for k, v in bounds.items():
        if isinstance(v, bool) and k.startswith("exclusive"):
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise SchemaError(f"must be a number, not {v!r}", keyword=k, pointer=pointer)
    return bounds


def _bound(bounds: dict, inclusive: str, exclusive: str, pointer: str) -> tuple[int | None, bool]:
    """One side of a number interval as (integer bound or None, open?)."""
    value, is_open = bounds.get(inclusive), bounds.get(exclusive) is True
    other = bounds.get(exclusive)
    if isinstance(other, (int, float)) and not isinstance(other, bool):
        tighter = value is None or (other >= value if inclusive == "minimum" else other <= value)
        value, is_open = (other, True) if tighter else (value, False)
    if value is not None and value != int(value):
        raise SchemaError(f"non-integer bound {value} on a number is not supported", keyword=inclusive, pointer=pointer)
    return (None if value is None else int(value)), is_open


def _natural(schema: dict, keyword: str, pointer: str, default):
    value = schema.get(keyword, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"must be a non-negative integer, not {value!r}", keyword=keyword, pointer=pointer)
    return value


def _nonempty(regex: str, keyword: str, pointer: str) -> str:
    if regex == jr.NOTHING:
        raise SchemaError("no number satisfies the bounds", keyword=keyword, pointer=pointer)
    return regex


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _alternation(options: list[str]) -> str:
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


def _escape_pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


__all__ = ["regex_from_schema", "SchemaError", "RegexError"]

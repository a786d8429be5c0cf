"""JSON Schema (or a pydantic model) -> an `rx` term whose strings are valid JSON under the schema.

Policies (all documented in the README):
- Whitespace: compact JSON by default (`{"a":1}`), because it leaves the most forced tokens; pass
  `whitespace=r"[ \\n]?"` (any regex) to allow whitespace between JSON tokens.
- Properties are written in schema order; optional ones may be left out (`property_order="any"`:
  in any order, each declared key at most once, extra keys anywhere). `additionalProperties`
  absent means closed objects (only the listed properties) unless `additional_properties=True`.
- Values nest to any depth the schema allows: free-form values (`{}`, `true`, open additional properties) and
  recursive `$ref`s (those on a cycle) are `rx.call`s of rules whose bodies call themselves, so a DFA state is a
  stack (fsm/rx.py, `Rule`); an allOf met again inside its own merge is a rule too, and schemas that meet on one
  value are merged (`Compiler.meet`), so no call is held under an intersection that a merge avoids. A recursion the
  rules cannot express (reached before any byte, under an intersection, or whose emptiness is undecided) is unrolled
  as with `max_recursion_depth=3`. An explicit `max_recursion_depth` is an opt-in limit:
  at most that many recursive `$ref`s are nested (deeper alternatives are left out) and free-form values nest at
  most as deep. Each (ref, depth) is compiled once, so $ref chains are shared, never re-expanded.
- Strings with `pattern` or `format` are written without escape sequences.
The language is always a subset of the valid instances (the compiler builds an under-approximation
L and, for `not`, `oneOf` and `if`, an over-approximation U of each subschema: `not S` is L ∩ ¬U(S)).
A validation keyword it cannot enforce raises `SchemaError` naming it and its JSON pointer; unknown
keywords are annotations and unknown `format`s are ignored, as validators do (see `notes`).
The dialect `$schema` names (draft-04 to 2020-12; none: 2020-12) decides what each keyword means
(`fsm.dialects`); an unknown `$schema` raises `SchemaError`.
"""

from __future__ import annotations

import json

from fsm import json_terms as jt
from fsm import rx
from fsm.budget import Budget, GuideBudgetError, metered
from fsm.dialects import DEFAULT, Dialect, as_dict, declared, dialect_at, dialect_of, read
from fsm.enum_filter import valid_constants
from fsm.errors import RegexError, SchemaError
from fsm.merge import VALIDATION, Unsatisfiable, merge_all, resolve_pointer
from fsm.negation import SchemaFacts
from fsm.object_policy import object_policy
from fsm.refs import absolute_refs
from fsm.schema_logic import logic, union
from fsm.schema_types import proved_empty
from fsm.unevaluated import close_unevaluated

UNSUPPORTED = frozenset("$dynamicRef $recursiveRef".split())
ROOT_SEARCH = 100_000  # states explored to prove the whole language empty (then: SchemaError, not a dead guide)
SKELETON_EXTRA_DEPTH = 4  # counting terms (minProperties, contains) see values this much deeper than free-form ones
FALLBACK_DEPTH = 3  # recursion unrolled this deep where rules cannot express it
MAX_PLAIN_RETRIES = 4  # compiles that learn which rules are not plain before all are taken as not plain




def compile_schema(
    schema,
    *,
    whitespace: str = "",
    policy: str | None = None,
    additional_properties: bool | None = None,
    max_recursion_depth: int | None = None,
    property_order: str | None = None,
    budget: Budget | None = None,
) -> rx.Rx:
    """Term for the JSON texts (compact unless `whitespace` says otherwise) that validate against `schema`.

    Parameters
    ----------
    schema : pydantic model class, dict or str
        A pydantic ``BaseModel`` subclass, a JSON Schema dict, or a JSON Schema as a JSON string.
    whitespace : str
        Regex allowed between JSON tokens ("" = compact JSON, the default).
    policy : {"compact", "spec"}, optional
        One name for how objects are read (default "compact"):

        - "compact" = ``additional_properties=False, property_order="schema"``: objects hold only the
          listed properties, in the order of ``properties``. The default, because a model writes
          what the schema lists, in the order it lists it, so more tokens are forced and no
          undeclared key slips in; every text it accepts is valid, but valid texts with other keys or
          another order are rejected.
        - "spec" = ``additional_properties=True, property_order="any"``: what a validator accepts
          (members in any order, further keys where ``additionalProperties`` does not forbid them,
          numbers in any spelling of their value), up to repeated keys and what raises `SchemaError`.

        An explicit ``additional_properties`` or ``property_order`` overrides the policy's choice.
    additional_properties : bool, optional
        How to read objects that do not say ``additionalProperties``: False allows only the listed
        properties, True also allows further keys with any JSON value.
    max_recursion_depth : int, optional
        None (the default): any depth. An int: how many times a recursive ``$ref`` is unrolled, and how deep
        free-form values nest (an opt-in limit).
    property_order : str, optional
        "schema": object members in the order of ``properties``, optional ones may be left out, extra
        keys last. "any": members in any order, each declared key at most once (extra keys anywhere),
        exactly the objects validators accept (up to repeated extra keys).
    budget : fsm.Budget, optional
        Limits on the work and time of this compile (default ``fsm.Budget()``).

    Returns
    -------
    rx.Rx
        The term; `compile_with_notes(schema, ...)` also lists what was ignored (unknown formats).

    Raises
    ------
    SchemaError
        For an invalid schema or a keyword that cannot be enforced; names the keyword and JSON pointer.
    GuideBudgetError
        When the compile goes past `budget`; names the innermost subschema being compiled.
    """
    return compile_with_notes(schema, whitespace=whitespace, policy=policy, additional_properties=additional_properties,
                              max_recursion_depth=max_recursion_depth, property_order=property_order, budget=budget)[0]


def compile_with_notes(
    schema,
    *,
    whitespace: str = "",
    policy: str | None = None,
    additional_properties: bool | None = None,
    max_recursion_depth: int | None = None,
    property_order: str | None = None,
    budget: Budget | None = None,
) -> tuple[rx.Rx, list[str]]:
    """Like `compile_schema`, also returning notes ("format 'int32' ignored at #/properties/a")."""
    try:
        with metered(budget, "compiling the schema"):
            return _compile_with_notes(schema, whitespace, policy, additional_properties, max_recursion_depth,
                                       property_order)
    except GuideBudgetError as error:
        raise error.at("#") from None


def _compile_with_notes(schema, whitespace, policy, additional_properties, max_recursion_depth, property_order):
    additional_properties, property_order = object_policy(policy, additional_properties, property_order)
    root, ws = as_dict(schema), _whitespace(whitespace)
    dialect = dialect_of(root)
    try:
        root = absolute_refs(root, dialect)
        term, compiler = _compile_root(Compiler.setup(root, ws, additional_properties, property_order, dialect),
                                       max_recursion_depth)
    except RecursionError:  # e.g. allOf through $ref cycles: a clear error instead of a crash
        raise SchemaError("the schema nests too deeply to compile (Python's recursion limit)", pointer="#") from None
    if term is rx.NOTHING or (not term.plain and _surely_empty(term, limit=ROOT_SEARCH)):
        keyword = "$ref" if compiler.cut else None
        raise SchemaError("the schema accepts no value that can be generated", keyword=keyword, pointer="#")
    return term, compiler.notes


def _compile_root(make, max_recursion_depth: int | None) -> tuple[rx.Rx, "Compiler"]:
    """(term, compiler) of the root: with rules for recursion (plain where their bodies are, found by retrying with
    the rules that turned out not plain, and those reaching them, marked), else unrolled `FALLBACK_DEPTH` deep."""
    if max_recursion_depth is not None:
        compiler = make(max_recursion_depth)
        return compiler.compile(compiler.read_root(), "#"), compiler
    nonplain: set[str] = set()
    for attempt in range(MAX_PLAIN_RETRIES + 1):  # the last takes every rule as not plain
        compiler = make(None, frozenset(nonplain) if attempt < MAX_PLAIN_RETRIES else None)
        try:
            term = compiler.compile(compiler.read_root(), "#")
        except NotPlain as found:
            nonplain |= compiler.reaching(found.ref)
            continue
        except (rx.UndefinedRule, Entangled, RecursionError):  # a rule asked about while its body compiled, held by
            break  # an intersection, or terms too deep for Python's stack: unrolled instead
        if compiler.rules_problem() is None and not rx.calls_under_intersection([term]):
            return term, compiler
        break
    compiler = make(FALLBACK_DEPTH)
    return compiler.compile(compiler.read_root(), "#"), compiler


class Entangled(Exception):
    """A rule's body holds a call inside an intersection or complement (`rx.calls_under_intersection`): unroll."""


class NotPlain(Exception):
    """A rule assumed plain has a body with intersections or complements: compile again with it marked."""

    def __init__(self, ref: str):
        super().__init__(ref)
        self.ref = ref


def _whitespace(pattern: str) -> rx.Rx:
    if pattern == "":
        return rx.EPSILON
    from fsm.rx_parse import parse

    try:
        return parse(pattern)
    except RegexError as error:
        raise SchemaError(f"whitespace regex {pattern!r}: {error}") from None


def _surely_empty(term: rx.Rx, limit: int = 500) -> bool:
    return proved_empty(term, limit)


class Compiler:
    """Schema -> under-approximation L (`compile`) and over-approximation U (`upper`) of its JSON texts."""

    def __init__(self, root, ws: rx.Rx, open_objects: bool, max_depth: int | None, property_order: str = "schema",
                 dialect: Dialect = DEFAULT, nonplain: frozenset | None = frozenset()):
        from fsm.schema_upper import Upper

        self.root, self.ws, self.open_objects, self.max_depth = root, ws, open_objects, max_depth
        self.dialect, self.targets = dialect, {}  # targets: $ref -> its subschema read in the dialect
        found = declared(root) | {dialect.name}
        self.whole_integers = "draft-04" in found  # enum/const values then meet their type's spelling
        self.switches = len(found) > 1  # a subschema declares another dialect than the root
        self.property_order = property_order  # "schema" | "any" (see compile_schema)
        self.depth = 0  # recursive $refs (those on a cycle) entered on the way here
        self.memo: dict[tuple, rx.Rx] = {}
        self.texts: dict[tuple, rx.Rx] = {}  # (subschema as JSON, depth, negations) -> its term (cases repeat them)
        self.reach: dict[str, frozenset[str]] = {}  # $ref -> every $ref its target reaches (`reachable`)
        self.linked: dict[str, frozenset[str]] = {}  # $ref -> the $refs written in its target (`links`)
        self.disjoint: dict[tuple[int, int], bool] = {}  # (term id, U id) -> proved disjoint (schema_logic.exclude)
        self.disjoint_options: dict[tuple[int, int], tuple] = {}  # (id, id) -> (a, b, disjoint) of oneOf options
        self.negations = 0  # `not`s around the subschema being compiled, up to where cases stop (schema_logic.logic)
        self.notes: list[str] = []
        self.cut = False  # a $ref went deeper than max_depth somewhere
        self.merging: set[str] = set()  # cyclic $refs inlined by the merges enclosing this compile (see `inline`)
        self.rules: dict[tuple, rx.Rx] = {}  # (ref, negations) -> the call of its rule (max_depth None)
        self.clean: set[int] = set()  # ids of terms that hold no call under an intersection (`_define`)
        self.open_merges: dict[tuple, rx.Rx | None] = {}  # (allOf text, negations) being compiled -> its rule's call
        self.nonplain = nonplain  # refs whose rules have intersections (None: every rule), the others assumed plain
        self.upper = Upper(self)
        self.facts = SchemaFacts(self.resolve)  # what surely holds of a subschema (`not`, `oneOf`: fsm.negation)
        self.any = jt.any_value(ws, max_depth)
        # counting terms intersect their items: a rule there would make emptiness undecidable, so they stay bounded
        self.skeleton = jt.any_value(ws, (FALLBACK_DEPTH if max_depth is None else max_depth) + SKELETON_EXTRA_DEPTH)

    def compile(self, schema, pointer: str) -> rx.Rx:
        """L: a term whose every string is valid under `schema` (the same subschema in the same context: one term)."""
        key = (_text(schema), self.depth, self.negations)
        found = self.texts.get(key)
        if found is None:
            try:
                found = self._compile(schema, pointer)
            except GuideBudgetError as error:
                raise error.at(pointer) from None
            if key[0] is not None:
                self.texts[key] = found
        return found

    def _compile(self, schema, pointer: str) -> rx.Rx:
        if schema is True:
            return self.any
        if schema is False:
            return rx.NOTHING
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}", pointer=pointer)
        kept = None if self.switches else valid_constants(schema, self.dialect.name, VALIDATION)
        if kept is not None:  # enum/const with other keywords: the values the validator accepts (fsm.enum_filter)
            from fsm.schema_types import constants

            return constants(self, {"enum": kept}, pointer) if kept else rx.NOTHING
        schema = close_unevaluated(validation_keywords(schema, pointer), pointer, self.resolve)
        if not schema:
            return self.any
        if "$ref" in schema:
            return self.ref(schema, pointer)
        if "allOf" in schema:
            return self.all_of(schema, pointer)
        if "not" in schema or "if" in schema:
            return self.logic(schema, pointer)
        if "anyOf" in schema or "oneOf" in schema:
            return self.union(schema, pointer)
        from fsm.schema_types import constants, dependencies, typed

        if any(k in schema for k in ("dependentRequired", "dependentSchemas", "dependencies")):
            return dependencies(self, schema, pointer)
        if "enum" in schema or "const" in schema:
            return constants(self, schema, pointer)
        return typed(self, schema, pointer)

    # -- references -------------------------------------------------------------------------------

    def resolve(self, ref: str, pointer: str):
        """The subschema `ref` points to, read in its dialect (`fsm.dialects.read`), for a `$ref` at `pointer`.

        Where a subschema declares its own `$schema`, the spec reads a target in the dialect above it and
        jsonschema in the referring subschema's: a `$ref` across such a boundary is refused unless both agree
        (or the target declares its own)."""
        target = self.target(ref, pointer)
        if self.switches and not (isinstance(target[0], dict) and "$schema" in target[0]):
            here = dialect_at(self.root, pointer, self.dialect)
            if here != target[1]:
                raise SchemaError(f"a $ref from {here.name} into {target[1].name} (a subschema's $schema) is not "
                                  "supported; declare $schema in the target", keyword="$ref", pointer=pointer)
        return target[2]

    def target(self, ref: str, pointer: str) -> tuple:
        """(raw subschema, its dialect, its reading) of the pointer `ref`."""
        if ref not in self.targets:
            raw = resolve_pointer(self.root, ref, pointer)
            dialect = dialect_at(self.root, ref.rsplit("/", 1)[0] if "/" in ref else "#", self.dialect)
            self.targets[ref] = (raw, dialect, read(raw, dialect, ref))
        return self.targets[ref]

    def ref(self, schema: dict, pointer: str) -> rx.Rx:
        ref = schema["$ref"]
        target = self.resolve(ref, pointer)
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if siblings:  # only from 2019-09 (`read` drops them in earlier drafts)
            return self.compile({"allOf": [{"$ref": ref}, siblings]}, pointer)
        cyclic = ref in self.reachable(ref)
        if cyclic and self.max_depth is None:
            return self.recursive(ref, target)
        if cyclic and self.depth >= self.max_depth:
            self.cut = True
            return rx.NOTHING
        key = (ref, self.depth if cyclic or any(r in self.reachable(r) for r in self.reachable(ref)) else None)
        if key not in self.memo:
            self.depth += cyclic
            try:
                self.memo[key] = self.compile(target, ref)
            finally:
                self.depth -= cyclic
        return self.memo[key]

    def recursive(self, ref: str, target) -> rx.Rx:
        """The call of the rule of a recursive `ref`: its own call inside its body (any depth, checked at the end)."""
        key = (ref, self.negations)
        if key not in self.rules:
            self.rules[key] = self._rule_call(ref)
            self._define(self.rules[key], self.compile(target, ref))
        return self.rules[key]

    def _rule_call(self, name: str) -> rx.Rx:
        """The call of a new rule `name`, plain unless a retry found its body is not."""
        return rx.call(rx.Rule(name), self.ws.plain and self.nonplain is not None and name not in self.nonplain)

    def _define(self, call: rx.Rx, body: rx.Rx) -> rx.Rx:
        """`call` with its rule's body set; Entangled or NotPlain where the rule cannot stand as called."""
        rule = call.args[0]
        rx.define(rule, body)
        if rx.calls_under_intersection([body], bodies=False, clean=self.clean):  # callees: at their own definition
            raise Entangled(rule.name)
        if call.plain and not body.plain:
            raise NotPlain(rule.name)
        return call

    def reaching(self, ref: str) -> set[str]:
        """`ref` and the $refs whose targets reach it."""
        return {ref} | {r for r, reached in self.reach.items() if ref in reached}

    @classmethod
    def setup(cls, root, ws: rx.Rx, open_objects: bool, property_order: str, dialect: Dialect):
        """A maker of compilers for one root: make(max_depth, nonplain=frozenset())."""
        return lambda max_depth, nonplain=frozenset(): cls(root, ws, open_objects, max_depth, property_order, dialect,
                                                           nonplain)

    def read_root(self):
        return read(self.root, self.dialect, "#")

    def rules_problem(self) -> str | None:
        """Why a rule cannot stand (`rx.check_rule`; then compile again another way), or None."""
        for (ref, _), term in self.rules.items():
            problem = rx.check_rule(term)
            if problem is not None:
                return f"{ref}: {problem}"
        return None

    def reachable(self, ref: str) -> frozenset[str]:
        """Every $ref reachable from `ref`'s target (what its term can depend on)."""
        if ref not in self.reach:
            self.reach[ref] = frozenset()  # cycles: filled in below
            found, todo = set(), [ref]
            while todo:
                for r in self.links(todo.pop()):
                    if r not in found:
                        found.add(r)
                        todo.append(r)
            self.reach[ref] = frozenset(found)
        return self.reach[ref]

    def links(self, ref: str) -> frozenset[str]:
        """The $refs written in `ref`'s target (none where it does not resolve: reported where it is compiled)."""
        if ref not in self.linked:
            try:
                self.linked[ref] = frozenset(_refs_in(self.target(ref, "#")[2]))
            except SchemaError:
                self.linked[ref] = frozenset()
        return self.linked[ref]

    # -- combinators --------------------------------------------------------------------------------

    def all_of(self, schema: dict, pointer: str) -> rx.Rx:
        """Merge the parts into one schema; where they cannot be merged, intersect their terms. With rules, an allOf
        met again inside its own merge (a part's $ref reaches it) is a call of a rule whose body is the merge, as a
        recursive $ref is (intersected terms would hold a call under the intersection: the unrolled fallback)."""
        if any(part is False for part in schema["allOf"]):
            return rx.NOTHING
        key = (_text(schema), self.negations)
        if self.max_depth is not None or key[0] is None:
            return self._merged(schema, pointer)
        if key in self.open_merges:
            if self.open_merges[key] is None:
                self.open_merges[key] = self.rules[("allOf " + key[0], key[1])] = self._rule_call("allOf " + key[0])
            return self.open_merges[key]
        self.open_merges[key] = None
        try:
            term = self._merged(schema, pointer)
        finally:
            call = self.open_merges.pop(key)
        return term if call is None else self._define(call, term)

    def _merged(self, schema: dict, pointer: str) -> rx.Rx:
        inlined = set()  # the $refs this merge inlines: while its result compiles, a merge reaching one again stops
        try:
            merged = merge_all(schema, pointer, lambda ref, where: self.inline(ref, where, inlined))
            self.merging |= inlined
            try:
                return self.compile(merged, pointer)
            finally:
                self.merging -= inlined
        except Unsatisfiable:
            return rx.NOTHING
        except GuideBudgetError:
            raise
        except SchemaError as error:
            if not _merge_failure(error):
                raise
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        parts = [self.compile(s, f"{pointer}/allOf/{i}") for i, s in enumerate(schema["allOf"])]
        return self.both(self.compile(rest, pointer) if rest else self.any, *parts)

    def both(self, *values: rx.Rx) -> rx.Rx:
        """The intersection of value terms, without the any-value term: every value term is inside it, and held under
        an intersection its recursive call would send the whole schema to the unrolled fallback."""
        kept = [v for v in values if v is not self.any]
        return rx.inter(*kept) if kept else self.any

    def meet(self, parts: list[tuple]) -> rx.Rx:
        """The values valid under every part, (schema, its pointer): each part compiled on its own first (an error
        says where it is), those that allow any value left out, the rest merged into one schema where they can be
        (`all_of`), so that no value term is held under an intersection that a merge avoids."""
        terms = [self.compile(schema, where) for schema, where in parts]
        kept = [part for part, term in zip(parts, terms) if term is not self.any]
        if len(kept) <= 1 or any(term is rx.NOTHING for term in terms):
            return self.both(*terms)
        return self.all_of({"allOf": [schema for schema, _ in kept]}, kept[0][1])

    def inline(self, ref: str, pointer: str, inlined: set) -> dict:
        """`resolve` for a merge; a $ref that an enclosing merge inlined is a cycle through allOf: not merged again
        (then the parts are compiled apart, and the $ref goes through `ref`, which bounds its recursion)."""
        if ref in self.merging:
            raise SchemaError("cannot be merged: allOf reaches its own $ref again", keyword="allOf", pointer=pointer)
        if ref not in self.merging and ref in self.reachable(ref):
            inlined.add(ref)
        return self.resolve(ref, pointer)

    def logic(self, schema: dict, pointer: str) -> rx.Rx:
        return logic(self, schema, pointer)

    def union(self, schema: dict, pointer: str) -> rx.Rx:
        return union(self, schema, pointer)


def _text(schema) -> str | None:
    """The subschema as canonical JSON (None where Python will not write it: integers over 4,300 digits)."""
    try:
        return json.dumps(schema, sort_keys=True, default=repr)
    except ValueError:
        return None


def validation_keywords(schema: dict, pointer: str) -> dict:
    """The keywords that constrain values (others are annotations); SchemaError for unsupported ones."""
    for keyword in schema:
        if keyword in UNSUPPORTED:
            raise SchemaError("this keyword cannot be enforced here", keyword=keyword, pointer=pointer)
    return {k: v for k, v in schema.items() if k in VALIDATION}


def _merge_failure(error: SchemaError) -> bool:
    return "cannot be merged" in str(error) or "too big to merge" in str(error) or "too deep to merge" in str(error)


def _refs_in(node) -> set[str]:
    found, stack = set(), [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if isinstance(n.get("$ref"), str):
                found.add(n["$ref"])
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return found


__all__ = ["compile_schema", "compile_with_notes", "SchemaError"]

"""Cases for the differential test of the schema compiler against `jsonschema`: instances drawn by
hypothesis-jsonschema, their mutants, and generated schemas that combine the keywords whose merges
and rewrites are easiest to get wrong. Everything is a pure function of a seed."""

from __future__ import annotations

import copy
import random

ATOM_KEYS = ("a", "b", "c", "x1")


def valid_instances(schema, n: int, seed: int) -> list:
    """Up to `n` instances hypothesis-jsonschema draws for `schema` ([] when it cannot)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis_jsonschema import from_schema

    _patch_many()
    found = []
    try:
        strategy = from_schema(schema)

        @fixed_seed(seed)
        @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def collect(value):
            found.append(value)

        collect()
    except Exception:  # noqa: BLE001 - unsupported or unsatisfiable for the generator: fewer instances
        pass
    return found


def _patch_many() -> None:
    """hypothesis-jsonschema 0.23 draws objects with `many(...).more()`, which Hypothesis 6.1xx replaced
    by `with many(...) as elements: for _ in elements`: give it the old interface on the new one."""
    import hypothesis.internal.conjecture.utils as cu
    import hypothesis_jsonschema._from_schema as generator
    if hasattr(cu.many, "more") or getattr(generator.cu, "patched", False):
        return

    class OldMany:
        def __init__(self, data, **sizes):
            self.many = cu.many(data, **sizes).__enter__()
            self.steps = iter(self.many)

        def more(self) -> bool:
            if next(self.steps, "stop") == "stop":
                self.many.__exit__(None)
                return False
            return True

        def reject(self, why=None) -> None:
            self.many.reject(why)

    generator.cu = type("cu", (), {"many": OldMany, "patched": True})


def mutants(value, rng: random.Random, k: int) -> list:
    """`k` mutants of `value`: a key dropped or added, a type changed, a number moved, keys shuffled, an item added
    or dropped."""
    nodes = list(_nodes(value, ()))
    out = []
    for _ in range(k):
        kind = rng.choice(MUTATIONS)
        changed = kind(copy.deepcopy(value), nodes, rng)
        if changed is not _NONE:
            out.append(changed)
    return out


_NONE = object()


def _nodes(value, path):
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _nodes(child, path + (key,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _nodes(child, path + (i,))


def _replace(root, path, new):
    if not path:
        return new
    node = root
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = new
    return root


def _pick(nodes, rng, test):
    chosen = [(p, n) for p, n in nodes if test(n)]
    return rng.choice(chosen) if chosen else (None, None)


def _drop_key(root, nodes, rng):
    path, node = _pick(nodes, rng, lambda n: isinstance(n, dict) and n)
    if path is None:
        return _NONE
    smaller = dict(node)
    del smaller[rng.choice(list(smaller))]
    return _replace(root, path, smaller)


def _add_key(root, nodes, rng):
    path, node = _pick(nodes, rng, lambda n: isinstance(n, dict))
    if path is None:
        return _NONE
    name = rng.choice(["zz", "extra", "a", "x1", "id", "name", "type"])
    return _replace(root, path, {**node, name: rng.choice([1, "s", None, True, [], {}])})


def _change_type(root, nodes, rng):
    path, node = rng.choice(nodes)
    others = [v for v in (0, 1.5, "s", None, True, [], {}, [1], {"a": 1}) if type(v) is not type(node)]
    return _replace(root, path, rng.choice(others))


def _out_of_range(root, nodes, rng):
    path, node = _pick(nodes, rng, lambda n: isinstance(n, (int, float)) and not isinstance(n, bool))
    if path is None:
        return _NONE
    return _replace(root, path, rng.choice([node + 10**6, -node - 10**6, node + 0.5, node - 1, node + 1, -1, 0]))


def _shuffle_keys(root, nodes, rng):
    path, node = _pick(nodes, rng, lambda n: isinstance(n, dict) and len(n) > 1)
    if path is None:
        return _NONE
    keys = list(node)
    rng.shuffle(keys)
    return _replace(root, path, {k: node[k] for k in (keys if keys != list(node) else keys[::-1])})


def _resize_array(root, nodes, rng):
    path, node = _pick(nodes, rng, lambda n: isinstance(n, list))
    if path is None:
        return _NONE
    if node and rng.random() < 0.5:
        return _replace(root, path, node[:-1])
    return _replace(root, path, node + [copy.deepcopy(node[-1]) if node else rng.choice([1, "s", None])])


MUTATIONS = (_drop_key, _add_key, _change_type, _out_of_range, _shuffle_keys, _resize_array)


def combination_schema(rng: random.Random) -> dict:
    """A small schema mixing allOf/anyOf/oneOf/$ref/unevaluated*/prefixItems/dependentSchemas/contains."""
    defs = {f"d{i}": _node(rng, 1, defs_count=0) for i in range(2)}
    return {"$defs": defs, **_node(rng, 2, defs_count=2)}


def _node(rng: random.Random, depth: int, defs_count: int) -> dict:
    if depth == 0 or rng.random() < 0.25:
        return _atom(rng)
    sub = lambda: _node(rng, depth - 1, defs_count)  # noqa: E731
    kind = rng.choice(["allOf", "anyOf", "oneOf", "ref", "unevaluatedProperties", "unevaluatedItems", "prefixItems",
                       "dependentSchemas", "not", "if", "contains", "sibling", "sibling"])
    if kind == "sibling":  # a keyword whose meaning depends on a sibling, split across allOf branches
        return _split_siblings(rng, sub)
    if kind in ("allOf", "anyOf", "oneOf"):
        return {kind: [sub() for _ in range(rng.randint(1, 3))], **(_atom(rng) if rng.random() < 0.4 else {})}
    if kind == "ref":
        ref = {"$ref": f"#/$defs/d{rng.randrange(defs_count)}"} if defs_count else _atom(rng)
        return {**ref, **(_atom(rng) if rng.random() < 0.5 else {})}
    if kind == "unevaluatedProperties":
        return {**sub(), "unevaluatedProperties": rng.choice([False, {"type": "integer"}])}
    if kind == "unevaluatedItems":
        return {**sub(), "unevaluatedItems": rng.choice([False, {"type": "string"}])}
    if kind == "prefixItems":
        items = [sub() for _ in range(rng.randint(1, 2))]
        return {"prefixItems": items, **({"items": sub()} if rng.random() < 0.5 else {})}
    if kind == "dependentSchemas":
        return {"dependentSchemas": {rng.choice(ATOM_KEYS): sub()}, **(_atom(rng) if rng.random() < 0.5 else {})}
    if kind == "not":
        return {"not": _atom(rng)}
    if kind == "if":
        return {"if": _atom(rng), "then": sub(), **({"else": sub()} if rng.random() < 0.5 else {})}
    return {"contains": _atom(rng), "minContains": rng.choice([0, 1, 2]),
            **({"maxContains": 2} if rng.random() < 0.3 else {})}


def _split_siblings(rng: random.Random, sub) -> dict:
    key = rng.choice(ATOM_KEYS)
    return rng.choice([
        {"allOf": [{"properties": {key: sub()}}, {"unevaluatedProperties": rng.choice([False, sub()])}]},
        {"properties": {key: sub()}, "allOf": [sub(), {"unevaluatedProperties": False}]},
        {"allOf": [{"prefixItems": [sub()]}], "items": sub()},
        {"allOf": [{"prefixItems": [sub()]}, {"items": sub()}]},
        {"allOf": [{"prefixItems": [sub()]}, {"unevaluatedItems": rng.choice([False, sub()])}]},
        {"allOf": [{"contains": _atom(rng), "minContains": rng.choice([0, 2])}, {"contains": _atom(rng)}]},
        {"allOf": [{"patternProperties": {"^x": sub()}}, {"additionalProperties": sub()}]},
        {"allOf": [{"required": [key]},
                   {"properties": {"a": sub()}, rng.choice(["additionalProperties", "unevaluatedProperties"]): False}]},
        {"$ref": "#/$defs/d0", "properties": {key: sub()}, "unevaluatedProperties": rng.choice([False, sub()])},
        {"allOf": [{"if": _atom(rng), "then": sub()}, {"if": _atom(rng), "else": sub()}]}])


def _atom(rng: random.Random) -> dict:
    key, k = rng.choice(ATOM_KEYS), rng.randint(0, 3)
    return rng.choice([
        {"type": "object"}, {"type": "array"}, {"type": "integer", "minimum": k}, {"type": "string", "maxLength": k},
        {"properties": {key: rng.choice([{"type": "integer"}, {"type": "string"}, True])}}, {"required": [key]},
        {"patternProperties": {"^x": {"type": "integer"}}},
        {"additionalProperties": rng.choice([False, {"type": "string"}])},
        {"items": {"type": "integer"}}, {"minItems": k}, {"maxItems": k}, {"const": rng.choice([1, "a", None])},
        {"enum": [1, 2.0, "a"]}, {"properties": {key: {"type": "integer"}}, "additionalProperties": False},
        {"prefixItems": [{"type": "integer", "minimum": k}]}, {"items": {"type": "integer", "minimum": k}},
        {"unevaluatedProperties": False}, {"unevaluatedItems": False},
        {"contains": {"type": "string"}, "minContains": k % 2},
        {"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": {"type": "string"}}])


def value_pool(rng: random.Random, n: int) -> list:
    """Small JSON values over the combination schemas' keys, bounds and constants."""
    scalars = [0, 1, 2, 3, 5, 6, -1, 1.5, 2.0, "a", "s", "abcd", None, True]
    items = [0, 1, 2, 3, 4, 5, 6, "a", "s", None]
    out = list(scalars)
    while len(out) < n:
        if rng.random() < 0.5:
            keys = rng.sample(ATOM_KEYS + ("x2",), rng.randint(0, 3))
            out.append({key: rng.choice(scalars + [[1]]) for key in keys})
        else:
            out.append([rng.choice(items) for _ in range(rng.randint(0, 3))])
    return out

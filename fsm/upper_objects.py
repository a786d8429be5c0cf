"""Over-approximations of objects that see their top-level members, not every nested key.

U(S) (fsm/schema_upper.py) must hold every valid text; a required key with its value was written as "the text
contains `"key":value` somewhere", which a nested object matches too. Then every instance of a `oneOf` option
whose nested values repeat another option's discriminating member (GeoJSON's FeatureCollection holds Features,
Vega-Lite's FacetSpec holds a UnitSpec) falls in the other option's U and is lost, and proving that loss takes an
exhaustive search. Here a member is matched at the top level of the object:

    has(k, V)  = { ws (loose , ws)? "k" ws : ws V ws (, loose)? }        (loose: balanced brackets, strings)

`loose` tokens nest at most DEPTH levels, so texts nested deeper are added whole (`deep`): U stays a superset of
the valid texts at every depth, and precise on the texts a guide writes (which rarely nest this deep).
"""

from __future__ import annotations

from functools import lru_cache

from fsm import rx

DEPTH = 12  # nesting (of arrays and objects) up to which top-level members are told apart from nested ones

_SPECIAL = b'"[]{}\\'
_OTHER = rx.byte_set(rx.ALL_BYTES ^ sum(1 << b for b in _SPECIAL))  # commas, colons, digits, letters, spaces ...
_LOOSE_STRING = rx.seq(  # any string, escapes included: a backslash escapes the next byte
    rx.literal('"'), rx.star(rx.alt(rx.byte_set(rx.ALL_BYTES ^ (1 << 0x22 | 1 << 0x5C)),
                                    rx.seq(rx.literal("\\"), rx.byte_set(rx.ALL_BYTES)))), rx.literal('"'))
_OPEN = rx.byte_set(1 << ord("{") | 1 << ord("["))


@lru_cache(maxsize=None)
def loose(depth: int) -> rx.Rx:
    """Runs of JSON tokens (strings, brackets balanced, anything else between) nested at most `depth` levels."""
    token = [_OTHER, _LOOSE_STRING]
    if depth > 0:
        inner = loose(depth - 1)
        token += [rx.seq(rx.literal("{"), inner, rx.literal("}")), rx.seq(rx.literal("["), inner, rx.literal("]"))]
    return rx.star(rx.alt(*token))


@lru_cache(maxsize=None)
def deep(depth: int = DEPTH) -> rx.Rx:
    """Texts that open more than `depth` brackets at once somewhere (followed by anything)."""
    reach = rx.ANYTHING
    for level in range(depth, -1, -1):  # level: brackets open before this step
        reach = rx.seq(loose(depth - level), _OPEN, reach)
    return reach


def has_member(key: rx.Rx, value: rx.Rx, ws: rx.Rx, depth: int = DEPTH) -> rx.Rx:
    """Objects nested at most `depth` levels with a top-level member `key`: `value` (key a term of the quoted key)."""
    inner = loose(depth - 1)
    before = rx.optional(rx.seq(inner, rx.literal(","), ws))
    after = rx.optional(rx.seq(rx.literal(","), inner))
    return rx.seq(rx.literal("{"), ws, before, key, ws, rx.literal(":"), ws, value, ws, after, rx.literal("}"))


def object_upper(required: list[tuple[rx.Rx, rx.Rx]], optional: list[tuple[rx.Rx, rx.Rx]], ws: rx.Rx) -> rx.Rx:
    """A superset of the objects that have every `required` (key, value) member at the top level and, for every
    `optional` one, either lack its key there or hold a value in it there. Deeper texts are all kept."""
    parts = [has_member(k, v, ws) for k, v in required]
    parts += [rx.alt(rx.complement(has_member(k, rx.ANYTHING, ws)), has_member(k, v, ws)) for k, v in optional]
    shallow = rx.inter(rx.seq(rx.literal("{"), rx.ANYTHING), *parts)
    return rx.alt(shallow, rx.inter(rx.seq(rx.literal("{"), rx.ANYTHING), deep()))

"""Regular expressions over bytes as hash-consed terms, with Brzozowski derivatives.

A term (`Rx`) denotes a set of byte strings. Terms are built only through the smart constructors
below, which normalize as they build (flatten, drop the empty set, merge byte classes, sort
alternatives), so equal-looking terms are the same object and the derivatives of any term reach
finitely many terms: each term *is* a DFA state, computed on demand. Intersection and complement
are as cheap as union, which is what JSON Schema needs (`pattern` with lengths, `not`, `if`).

    d(term, byte) = the strings s such that byte + s is in term

Only `Rx.classes` (a partition of the 256 bytes into blocks with equal derivatives) and
`derivative(term, byte)` are needed to build a DFA lazily; see fsm/lazy_dfa.py.
"""

from __future__ import annotations

import functools
import itertools
import operator
import weakref
from _weakref import _remove_dead_weakref  # what WeakValueDictionary removes dead entries with

from fsm import budget as _budget

ALL_BYTES = (1 << 256) - 1
_ids = itertools.count()
_ID = operator.attrgetter("id")
_UNKNOWN = object()  # `Rx._impure` not computed yet
_interned_refs: dict = {}  # key -> _Ref to the term (a dead one reads None until its callback removes it)


class _Ref(weakref.ref):
    """A weak reference that knows its key (WeakValueDictionary's KeyedRef, built in C: no Python __init__)."""

    __slots__ = ("key",)


def _forget(ref: _Ref) -> None:
    """A term was freed: drop its key, unless a new term holds it already."""
    _remove_dead_weakref(_interned_refs, ref.key)


class Rx:
    """One interned term. kind is nothing | epsilon | bytes | seq | alt | and | not | repeat | anyorder |
    pick | hole | call.

    args: bytes -> (mask,) a 256-bit int; seq -> (head, tail); alt/and -> children sorted by id;
    not -> (child,); repeat -> (child, low, high or None);
    anyorder -> (sep, extra, universe, *required, *optional, n_required), each group sorted by id;
    pick -> (items, owner) and hole -> (item,): see `any_order_list`; call -> (rule,): see `Rule`.
    """

    __slots__ = ("id", "kind", "args", "nullable", "plain", "_classes", "_derivatives", "_empty", "_expansion",
                 "_witness", "_holes", "_gave_up", "_pending", "_impure", "__weakref__")

    def __init__(self, kind: str, args: tuple, nullable: bool, plain: bool):
        self.id, self.kind, self.args, self.nullable, self.plain = next(_ids), kind, args, nullable, plain
        self._classes = None  # tuple of byte masks, a partition of all 256 bytes
        self._derivatives: dict[int, Rx] = {}  # block index -> derivative
        self._empty = None if not plain else kind == "nothing"
        self._expansion = None  # anyorder: see `_list_memo`
        self._holes = None  # items whose hole ends a branch of this term (see `_holes_in`)
        self._witness = None  # a string of the term found by structure, or _NO_WITNESS (see `witness`)
        self._gave_up = 0  # the largest limit an emptiness search of this term went past (see `_decide`)
        self._pending = None  # a string of it whose derivatives are marked live as they are built (`_mark_live`)
        self._impure = _UNKNOWN  # a sequence link: its first link or last part that is not plain (see `_impure_parts`)

    def __repr__(self) -> str:
        return f"Rx#{self.id}({self.kind})"

    @property
    def children(self) -> tuple:
        if self.kind in ("seq", "alt", "and", "not", "pick"):
            return self.args
        if self.kind == "anyorder":
            return self.args[:-1]
        return self.args[:1] if self.kind in ("repeat", "hole") else ()

    @property
    def classes(self) -> tuple[int, ...]:
        """Blocks of bytes on which the derivative is the same term (byte masks, disjoint, cover all)."""
        if self._classes is None:
            self._classes = _classes(self)
        return self._classes


def _term(kind: str, args: tuple, nullable: bool, plain: bool, key: tuple | None = None) -> Rx:
    """The interned term of (kind, args); `key`, where the caller has it at hand: (kind, *ids or values of args)."""
    if key is None:
        key = (kind, *(a.id if isinstance(a, Rx) else a for a in args))
    ref = _interned_refs.get(key)
    found = None if ref is None else ref()
    if found is None:
        found = Rx(kind, args, nullable, plain)
        ref = _interned_refs[key] = _Ref(found, _forget)
        ref.key = key
        if _budget._active:  # a budgeted build is running (under BUILD_LOCK)
            _budget._active[-1].tick(found)
    return found


# -- constructors --------------------------------------------------------------------------------

NOTHING = _term("nothing", (), False, True)
EPSILON = _term("epsilon", (), True, True)


def byte_set(mask: int) -> Rx:
    """One byte out of `mask` (bit b set = byte b allowed)."""
    if mask == 0:
        return NOTHING
    mask &= ALL_BYTES
    return _term("bytes", (mask,), False, True, ("bytes", mask))


def byte_range(low: int, high: int) -> Rx:
    return byte_set(_range_mask(low, high))


@functools.lru_cache(maxsize=4096)  # keys and constants recur across a schema's objects
def literal(data: bytes | str) -> Rx:
    """Exactly `data` (a str is UTF-8 encoded)."""
    data = data.encode() if isinstance(data, str) else data
    return seq(*(byte_set(1 << b) for b in data))


def seq(*terms: Rx) -> Rx:
    """Concatenation."""
    out = EPSILON
    for term in reversed(terms):
        out = _seq2(term, out)
    return out


def _seq2(head: Rx, tail: Rx) -> Rx:
    if head is NOTHING or tail is NOTHING:
        return NOTHING
    if head is EPSILON:
        return tail
    if tail is EPSILON:
        return head
    if head.kind == "seq":  # re-associate to the right, iteratively: chains can be thousands long
        parts = []
        while head.kind == "seq":
            parts.append(head.args[0])
            head = head.args[1]
        for part in reversed([*parts, head]):
            tail = _seq2(part, tail)
        return tail
    return _term("seq", (head, tail), head.nullable and tail.nullable, head.plain and tail.plain,
                 ("seq", head.id, tail.id))


def alt(*terms: Rx) -> Rx:
    """Union."""
    parts, mask = _flatten(terms, "alt"), 0
    parts = {t.id: t for t in parts if t is not NOTHING}
    for key in [k for k, t in parts.items() if t.kind == "bytes"]:
        mask |= parts.pop(key).args[0]
    if mask:
        parts[-1] = byte_set(mask)
    if any(t.kind == "not" and t.args[0] is NOTHING for t in parts.values()):
        return ANYTHING
    return _nary("alt", list(parts.values()), NOTHING, any)


def inter(*terms: Rx) -> Rx:
    """Intersection."""
    parts = _flatten(terms, "and")
    if any(t is NOTHING for t in parts):
        return NOTHING
    parts = {t.id: t for t in parts if t is not ANYTHING}
    masks = [parts.pop(k).args[0] for k in [k for k, t in parts.items() if t.kind == "bytes"]]
    if masks:
        parts[-1] = byte_set(_and_all(masks))
    if EPSILON.id in parts:  # ε ∩ r is ε when r matches the empty string, else nothing
        return EPSILON if all(t.nullable for t in parts.values()) else NOTHING
    return _nary("and", list(parts.values()), ANYTHING, all)


def complement(term: Rx) -> Rx:
    """Every byte string not in `term`."""
    if term.kind == "not":
        return term.args[0]
    return _term("not", (term,), not term.nullable, False, ("not", term.id))


def repeat(term: Rx, low: int, high: int | None = None) -> Rx:
    """`term` repeated low..high times (high None: unbounded)."""
    if high is not None and (high < low or high == 0):
        return EPSILON if high == 0 else NOTHING
    if term is NOTHING:
        return EPSILON if low == 0 else NOTHING
    if term is EPSILON or (low == high == 1):
        return term
    if term.kind == "repeat" and term.args[1:] == (0, None) and (low, high) in ((0, None), (1, None)):
        return term
    return _term("repeat", (term, low, high), low == 0 or term.nullable, term.plain, ("repeat", term.id, low, high))


def star(term: Rx) -> Rx:
    return repeat(term, 0, None)


def optional(term: Rx) -> Rx:
    return alt(term, EPSILON)


ANYTHING = _term("not", (NOTHING,), True, False)  # every byte string; the identity of `inter`


class Rule:
    """A language that may contain itself (any JSON value, a recursive `$ref`): `call(rule)` stands for it inside
    its own body, which is set once by `define`. The recursion must be guarded (a call only after a byte), the body
    non-empty and never the empty string: `check_rule` says whether it is. A derivative unfolds one call, so a DFA
    state is the open part of the innermost value followed by what closes each enclosing one: a stack, as a term.
    """

    __slots__ = ("name", "body", "open")

    def __init__(self, name: str):
        self.name, self.body, self.open = name, None, set()  # open: questions about the rule being answered

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"


class UnguardedRecursion(ValueError):
    """A rule's body reaches a call of a rule being expanded before any byte (see `check_rule`)."""


class UndefinedRule(ValueError):
    """A question about a call whose rule has no body yet (its body is being compiled)."""


def call(rule: Rule, plain: bool) -> Rx:
    """The language of `rule` (its body, once defined). `plain`: the body has no intersection or complement (then
    the body must have a witness, see `check_rule`)."""
    return _term("call", (rule,), False, plain)


def define(rule: Rule, body: Rx) -> None:
    """Set the body of `rule` (once)."""
    if rule.body is not None:
        raise ValueError(f"{rule!r} is already defined")
    rule.body = body


def check_rule(term: Rx, limit: int = 500) -> str | None:
    """Why the call `term` cannot stand as a state (None when it can): unguarded recursion, a body that matches the
    empty string or nothing, a plain call whose body is not plain, or emptiness undecided within `limit` terms."""
    rule = term.args[0]
    if rule.body is None or rule.body is NOTHING:
        return "an empty body"
    if rule.body.nullable:
        return "a body that matches the empty string"
    if term.plain and not rule.body.plain:
        return "not plain"
    try:
        term.classes  # noqa: B018 (computed and memoized here: unguarded recursion raises)
    except UnguardedRecursion:
        return "unguarded recursion"
    if _witnessed(term):  # witness and liveness memoized now, while no other rule is open
        return None
    if term.plain:
        return "an empty language"
    try:
        return "an empty language" if is_empty(term, limit) else None
    except UndecidedError:
        return "emptiness undecided"


def calls_under_intersection(roots, bodies: bool = True, clean: set[int] | None = None) -> bool:
    """Whether a call lies inside an intersection or complement of the terms `roots` or (`bodies`) of the bodies they
    call: there an emptiness search meets the rule's endless states, so such a language is better unrolled
    (fsm/schema.py). `clean` (with `bodies` False): ids of terms found to hold none, not walked again; the terms
    walked are added to it when none is found."""
    has_call: dict[int, bool] = {}
    seen, stack, skipped = set(), list(roots), clean or ()
    while stack:
        t = stack.pop()
        if t.id in seen or t.id in skipped:
            continue
        seen.add(t.id)
        if t.kind in ("and", "not") and _has_call(t, has_call):
            return True
        stack.extend(t.children)
        if bodies and t.kind == "call" and t.args[0].body is not None:  # a rule being compiled: checked once defined
            stack.append(t.args[0].body)
    if clean is not None:
        clean |= seen
    return False


def _has_call(term: Rx, memo: dict[int, bool]) -> bool:
    """Whether a call is among the subterms of `term` (calls not unfolded)."""
    order, stack = [], [term]
    while stack:  # post-order without recursion
        t = stack.pop()
        if t.id not in memo:
            memo[t.id] = t.kind == "call"
            order.append(t)
            stack.extend(t.children)
    for t in reversed(order):
        memo[t.id] = memo[t.id] or any(memo[c.id] for c in t.children)
    return memo[term.id]


def _unfold(term: Rx, question: str, answer, busy):
    """answer(body) for the call `term`, or busy() when the same question about its rule is open (recursion)."""
    rule = term.args[0]
    if rule.body is None:
        raise UndefinedRule(f"{rule!r} is used before it is defined")
    if question in rule.open:
        return busy()
    rule.open.add(question)
    try:
        return answer(rule.body)
    finally:
        rule.open.discard(question)


def any_order_list(required, optional, extra: Rx, sep: Rx, universe: Rx | None = None) -> Rx:
    """Non-empty `sep`-separated lists with each of `required` exactly once, each of `optional` at
    most once and any number of `extra`, in any order (the members of a JSON object in any order).

    A term of its own, expanded one item at a time when derived: a DFA state is the position inside
    the current item followed by the list of the items still allowed, built only where a walk goes.
    Unlike an intersection of one term per item, it stays plain (no emptiness search) when its items are.

    The expansion is `pick(universe, list)`: `universe` is the union of seq(item, hole(item)) over every
    item of the first list (`extra` too), kept by the lists that follow it; a hole stands for what may
    follow its item, filled by `pick` from the list at hand (nothing once a required or optional item was
    used). The derivatives of the universe are the same for every list of one object, so the work of
    walking an item is shared between them (see `split_pick`).

    Raises
    ------
    ValueError
        When an item matches the empty string (lists would parse more than one way).
    """
    if any(t is NOTHING for t in required):
        return NOTHING
    required = tuple(sorted(required, key=lambda t: t.id))
    optional = tuple(sorted((t for t in optional if t is not NOTHING), key=lambda t: t.id))
    if any(t.nullable for t in (*required, *optional, extra)):
        raise ValueError("the items of an any-order list must not match the empty string")
    if (not required and not optional and extra is NOTHING) or (sep is NOTHING and len(required) > 1):
        return NOTHING
    if universe is None:  # a first list (the lists that follow it keep its universe, whatever they allow)
        if sep is NOTHING:  # lists of one item
            return required[0] if len(required) == 1 else NOTHING if required else alt(*optional, extra)
        if not required and not optional:
            return seq(extra, star(seq(sep, extra)))
        universe = alt(*(seq(t, hole(t)) for t in (extra, *required, *optional)))
    items = (*required, *optional, extra)
    plain = sep.plain and all(t.plain for t in items)
    return _term("anyorder", (sep, extra, universe, *required, *optional, len(required)), False, plain)


def _any_order_parts(term: Rx) -> tuple[Rx, Rx, tuple, tuple]:
    """(sep, extra, required, optional) of an anyorder term."""
    n_required = term.args[-1]
    items = term.args[3:-1]
    return term.args[0], term.args[1], items[:n_required], items[n_required:]


def _expansion(term: Rx) -> Rx:
    """An anyorder term as the pick of its universe (memoized)."""
    memo = _list_memo(term)
    if memo[0] is None:
        memo[0] = pick(term.args[2], term)
    return memo[0]


def _list_memo(owner: Rx) -> list:
    """[its expansion or None, {item: what follows it}, the items it still allows] of an anyorder term."""
    memo = owner._expansion
    if memo is None:
        sep, extra, required, optional = _any_order_parts(owner)
        fillable = frozenset((*required, *optional, *((extra,) if extra is not NOTHING else ())))
        memo = owner._expansion = [None, {}, fillable]
    return memo


def hole(item: Rx) -> Rx:
    """The end of `item` in a universe (see `any_order_list`): matches the empty string, has no derivative."""
    return _term("hole", (item,), True, True, ("hole", item.id))


def pick(items: Rx, owner: Rx) -> Rx:
    """`items` (a universe or a derivative of one) with the hole of each item filled by what may follow
    that item in the anyorder term `owner` (`_after`); nothing where no hole can be filled."""
    if items is NOTHING or owner is NOTHING or not _holes_in(items) & _fillable(owner):
        return NOTHING
    nullable = any(_after(t, owner).nullable for t in _open_holes(items))
    return _term("pick", (items, owner), nullable, items.plain and owner.plain, ("pick", items.id, owner.id))


def pick_is_empty(items: Rx, owner: Rx, limit: int = 100_000, undecided: bool | None = None) -> bool:
    """Whether pick(items, owner) matches nothing; decided without building it where both are plain (a plain
    pick is NOTHING exactly when no hole of `items` can be filled). `limit`, `undecided`: as in `is_empty`."""
    if items is NOTHING or owner is NOTHING:
        return True
    if items.plain and owner.plain:
        return not _holes_in(items) & _fillable(owner)
    return is_empty(pick(items, owner), limit, undecided)


def _fillable(owner: Rx) -> frozenset:
    """The items an anyorder term still allows."""
    return _list_memo(owner)[2]


def _after(item: Rx, owner: Rx) -> Rx:
    """What may follow `item` in the anyorder term `owner` (nothing when `owner` no longer allows it)."""
    afters = _list_memo(owner)[1]
    found = afters.get(item)
    if found is None:
        sep, extra, required, optional = _any_order_parts(owner)
        universe = owner.args[2]
        rest = lambda r, o: _rest(r, o, extra, sep, universe)  # noqa: E731
        found = alt(rest(required, optional) if item is extra else NOTHING,
                    rest(_without(required, item), optional) if item in required else NOTHING,
                    rest(required, _without(optional, item)) if item in optional else NOTHING)
        afters[item] = found
    return found


def _without(items: tuple, item: Rx) -> tuple:
    return tuple(t for t in items if t is not item)


def _rest(required: tuple, optional: tuple, extra: Rx, sep: Rx, universe: Rx) -> Rx:
    """What may follow an item of an any-order list: more items after `sep`, or the end once no item is required."""
    more = seq(sep, any_order_list(required, optional, extra, sep, universe))
    return more if required else alt(more, EPSILON)


def _branches(items: Rx) -> tuple[Rx, ...]:
    return items.args if items.kind == "alt" else (items,)


def _chain(term: Rx) -> list[Rx]:
    """The parts of a sequence chain (one part for a term that is no sequence)."""
    parts = []
    while term.kind == "seq":
        parts.append(term.args[0])
        term = term.args[1]
    parts.append(term)
    return parts


def _impure_parts(term: Rx):
    """The parts of a sequence chain that are not plain, in order (`_chain` without the plain ones: a plain part
    is never empty, so emptiness asks only these). Each link memoizes where the next one is, so the derivatives of
    a long chain, which share its tail, skip its plain parts in one step."""
    link = _first_impure(term)
    while link is not None:
        if link.kind != "seq":
            yield link
            return
        yield link.args[0]
        link = _first_impure(link.args[1])


def _first_impure(term: Rx) -> Rx | None:
    """The first link of `term`'s chain whose head is not plain, else its last part where that is not plain, else
    None (memoized on every link walked)."""
    links = []
    while term.kind == "seq" and term._impure is _UNKNOWN and term.args[0].plain:
        links.append(term)
        term = term.args[1]
    if term.kind == "seq":
        found = term if term._impure is _UNKNOWN else term._impure
    else:
        found = None if term.plain else term
    for link in links:
        link._impure = found
    return found


def _holes_in(term: Rx) -> frozenset:
    """The items whose hole ends a branch of `term` (holes only ever end the chains of a universe's
    branches). Memoized on every chain link, so a derivative's new head costs one step."""
    if term._holes is None:
        if term.kind == "hole":
            term._holes = frozenset(term.args[:1])
        elif term.kind == "alt":
            term._holes = frozenset().union(*(_holes_in(t) for t in term.args))
        elif term.kind == "seq":
            links = []
            while term.kind == "seq" and term._holes is None:
                links.append(term)
                term = term.args[1]
            found = _holes_in(term)
            for link in links:
                link._holes = found
            return found
        else:
            term._holes = frozenset()
    return term._holes


def _open_holes(items: Rx) -> frozenset:
    """The items whose hole is reachable without a byte (a branch whose parts before the hole are nullable)."""
    if not items.nullable:
        return frozenset()
    return frozenset().union(*(_holes_in(b) for b in _branches(items) if b.nullable))


def without_words(term: Rx, words) -> Rx:
    """`term` less the finite set of byte strings `words`: inter(term, complement(alt(*words))) as a term
    of the same kind as `term` (plain when it is plain), byte by byte along the trie of `words`."""
    return _without_words(term, frozenset(w.encode() if isinstance(w, str) else bytes(w) for w in words))


@functools.lru_cache(maxsize=1024)  # objects that share their declared names (a $ref used many times)
def _without_words(term: Rx, words: frozenset) -> Rx:
    memo: dict = {}

    def build(t: Rx, left: frozenset) -> Rx:
        if not left or t is NOTHING:
            return t
        key = (t, left)
        if key not in memo:
            firsts = {w[0] for w in left if w}
            parts = [EPSILON] if t.nullable and b"" not in left else []
            for block in t.classes:
                others = block
                for byte in sorted(b for b in firsts if block >> b & 1):
                    others &= ~(1 << byte)
                    after = frozenset(w[1:] for w in left if w[:1] == bytes([byte]))
                    parts.append(seq(byte_set(1 << byte), build(derivative(t, byte), after)))
                if others:
                    parts.append(seq(byte_set(others), derivative(t, lowest_byte(others))))
            memo[key] = alt(*parts)
        return memo[key]

    return build(term, words)


def split_pick(term: Rx) -> tuple[Rx, tuple[tuple[Rx, Rx], ...]] | None:
    """(items, frames) with term = seq(pick(items, owner), tail) for frames = ((owner, tail),) (an anyorder
    term first counts as the pick of its universe), where no hole of `items` is open; descends into nested
    lists (an object inside an object's member), innermost items last, frames outermost first. A token
    that stays inside `items` ends in `unsplit(its end, frames)`, whatever items the owners still allow.
    None when the term starts with no such pick."""
    frames = []
    while True:
        first, tail = (term.args[0], term.args[1]) if term.kind == "seq" else (term, EPSILON)
        if first.kind == "anyorder":
            items, owner = first.args[2], first
        elif first.kind == "pick":
            items, owner = first.args
        else:
            break
        if items.nullable:
            break
        frames.append((owner, tail))
        term = items
    return (term, tuple(frames)) if frames else None


def unsplit(items: Rx, frames: tuple[tuple[Rx, Rx], ...]) -> Rx:
    """The term `split_pick` took apart, with `items` in place of its innermost items."""
    for owner, tail in reversed(frames):
        items = seq(pick(items, owner), tail)
    return items


def split_head(term: Rx) -> tuple[Rx, Rx] | None:
    """(head, tail) with term = seq(head, tail): head the shortest prefix of `term`'s sequence chain that
    does not match the empty string (what a DFA state must finish before its continuation), tail the
    rest. None when `term` is no sequence or no such prefix leaves a tail."""
    if term.kind != "seq":
        return None
    parts = []
    while term.kind == "seq":
        parts.append(term.args[0])
        if not term.args[0].nullable:
            return seq(*parts), term.args[1]
        term = term.args[1]
    return None


def _flatten(terms, kind: str) -> list[Rx]:
    out = []
    for t in terms:
        out.extend(t.args if t.kind == kind else (t,))
    return out


def _nary(kind: str, parts: list[Rx], identity: Rx, combine) -> Rx:
    if not parts:
        return identity
    if len(parts) == 1:
        return parts[0]
    parts.sort(key=_ID)
    nullable = combine(t.nullable for t in parts)
    return _term(kind, tuple(parts), nullable, kind == "alt" and all(t.plain for t in parts),
                 (kind, *[t.id for t in parts]))


def _and_all(masks: list[int]) -> int:
    out = ALL_BYTES
    for m in masks:
        out &= m
    return out


def _range_mask(low: int, high: int) -> int:
    return ((1 << (high + 1)) - 1) ^ ((1 << low) - 1)


# -- derivatives -----------------------------------------------------------------------------------


def derivative(term: Rx, byte: int) -> Rx:
    """The term for what may follow `byte` (memoized per block of `term.classes`)."""
    classes, bit, block = term._classes, 1 << byte, 0
    for mask in term.classes if classes is None else classes:  # `_block_of`, inline: the hot path
        if mask & bit:
            break
        block += 1
    found = term._derivatives.get(block)
    if found is None:
        found = term._derivatives[block] = _derive(term, byte)
    if term._pending is not None:
        _pass_on(term, byte, found)
    return found


def derivative_of_block(term: Rx, block: int) -> Rx:
    """The derivative of `term` by the bytes of `term.classes[block]` (memoized as `derivative`)."""
    found = term._derivatives.get(block)
    if found is None:
        found = term._derivatives[block] = _derive(term, lowest_byte(term.classes[block]))
    if term._pending is not None and term.classes[block] >> term._pending[0] & 1:
        _pass_on(term, term._pending[0], found)
    return found


def block_index(term: Rx, byte: int) -> int:
    """The index of the block of `term.classes` that holds `byte`."""
    return _block_of(term.classes, byte)


def _block_of(classes: tuple[int, ...], byte: int) -> int:
    bit = 1 << byte
    for i, mask in enumerate(classes):
        if mask & bit:
            return i
    raise AssertionError("classes do not cover every byte")


def _derive(term: Rx, byte: int) -> Rx:
    kind, args = term.kind, term.args
    if kind == "bytes":
        return EPSILON if args[0] >> byte & 1 else NOTHING
    if kind == "seq":
        head, tail = args
        if head.kind == "bytes":  # a literal's byte (never nullable): the tail or nothing
            return tail if head.args[0] >> byte & 1 else NOTHING
        out = _seq2(derivative(head, byte), tail)
        return alt(out, derivative(tail, byte)) if head.nullable else out
    if kind == "alt":
        return alt(*(derivative(t, byte) for t in args))
    if kind == "and":
        return inter(*(derivative(t, byte) for t in args))
    if kind == "not":
        return complement(derivative(args[0], byte))
    if kind == "repeat":
        child, low, high = args
        return _seq2(derivative(child, byte), repeat(child, max(low - 1, 0), None if high is None else high - 1))
    if kind == "anyorder":
        return derivative(_expansion(term), byte)
    if kind == "pick":
        items, owner = args
        return alt(pick(derivative(items, byte), owner),
                   *(derivative(_after(t, owner), byte) for t in _open_holes(items)))
    if kind == "call":
        return derivative(args[0].body, byte)
    return NOTHING  # nothing, epsilon, hole


def _classes(term: Rx) -> tuple[int, ...]:
    kind = term.kind
    if kind == "bytes":
        mask = term.args[0]
        return (mask, ALL_BYTES ^ mask) if mask != ALL_BYTES else (mask,)
    if kind == "seq":
        head, tail = term.args
        return _refine(head.classes, tail.classes) if head.nullable else head.classes
    if kind in ("alt", "and"):
        out = term.args[0].classes
        for t in term.args[1:]:
            out = _refine(out, t.classes)
        return out
    if kind in ("not", "repeat"):
        return term.args[0].classes
    if kind == "anyorder":
        return _expansion(term).classes
    if kind == "pick":
        items, owner = term.args
        out = items.classes
        for t in _open_holes(items):
            out = _refine(out, _after(t, owner).classes)
        return out
    if kind == "call":
        return _unfold(term, "classes", lambda body: body.classes, _unguarded)
    return (ALL_BYTES,)


def _unguarded():
    raise UnguardedRecursion("a recursive rule reaches itself before any byte")


def _refine(blocks: tuple[int, ...], other: tuple[int, ...]) -> tuple[int, ...]:
    """The coarsest partition finer than both."""
    if len(other) == 1:
        return blocks
    if len(blocks) == 1:
        return other
    out = []
    for a in blocks:
        for b in other:
            if a & b:
                out.append(a & b)
    return tuple(out)


def lowest_byte(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


# -- questions -------------------------------------------------------------------------------------


# terms an emptiness search may explore on a guide's first visit of a state before it forbids the derivative (about 25 s
# of CPU at worst; a lower bound leaves more searches undecided, and an undecided search memoizes nothing it explored)
WALK_LIMIT = 100_000
CHEAP_SEARCH = 16  # terms a union's alternatives are each searched first: one easy live alternative settles it
DEEPER = 2  # how much further each next round searches a union's undecided alternatives


class UndecidedError(ValueError):
    """An emptiness search went past its limit (see `is_empty`)."""


def is_empty(term: Rx, limit: int = 100_000, undecided: bool | None = None) -> bool:
    """Whether `term` matches no string at all.

    Decided by structure where it can (a sequence is empty when a part is, a union when every
    alternative is); only intersections and complements are explored, depth first, until a
    nullable derivative proves them non-empty.

    Parameters
    ----------
    undecided : bool, optional
        The answer when an exploration goes beyond `limit` terms (not memoized). A guide's walk passes True:
        what it cannot decide it forbids, so its language only narrows and no first visit raises mid-generation.

    Raises
    ------
    UndecidedError
        A `ValueError`: an exploration went beyond `limit` terms and `undecided` is None (instead of guessing).
    """
    found = _decide(term, limit)
    if found is None:
        if undecided is None:
            raise UndecidedError(f"deciding emptiness took more than {limit} states")
        return undecided
    return found


def _decide(term: Rx, limit: int) -> bool | None:
    """`is_empty`, or None where a search went past `limit`: only decided answers are memoized, and the limit given
    up at, so that the walk's several questions about one term (its token ends, its DFA state) search it once."""
    if term._empty is None:
        if limit <= term._gave_up:
            return None
        found = _structurally_empty(term, limit)
        if found is None:
            term._gave_up = max(term._gave_up, limit)
            return None
        term._empty = found
    return term._empty


def _some(values) -> bool | None:
    """True if a value is True, else None if one is undecided (None), else False."""
    stuck = False
    for value in values:
        if value:
            return True
        stuck = stuck or value is None
    return None if stuck else False


def _every(values) -> bool | None:
    """False if a value is False, else None if one is undecided (None), else True."""
    stuck = False
    for value in values:
        if value is False:
            return False
        stuck = stuck or value is None
    return None if stuck else True


def _structurally_empty(term: Rx, limit: int) -> bool | None:
    if term.nullable or term.plain:
        return term is NOTHING
    kind, args = term.kind, term.args
    decide = functools.partial(_decide, limit=limit)
    if kind == "seq":  # heads are never sequences: walk the chain instead of recursing on tails
        return _some(map(decide, _impure_parts(term)))
    if kind == "alt":
        return _alt_empty(args, limit)
    if kind == "repeat":
        return args[1] > 0 and decide(args[0])
    if kind == "anyorder":
        sep, extra, required, optional = _any_order_parts(term)
        if required:
            return _some(map(decide, (*required, *((sep,) if len(required) > 1 else ()))))
        return _every(map(decide, (*optional, extra)))
    if kind == "pick":
        return _every(f for f in (_pick_branch(b, args[1], decide, _some) for b in _branches(args[0]))
                      if f is not _UNFILLED)
    if kind == "call":  # the body, where the same question is not open already; else a search
        found = _unfold(term, "empty", decide, lambda: None)
        if found is not None:
            return found
    if _witnessed(term):  # proved non-empty without a search
        return False
    return _search_empty(term, limit)


def _alt_empty(alternatives: tuple, limit: int) -> bool | None:
    """Whether every alternative is empty: each searched to a limit that grows `DEEPER` times a round up to `limit`,
    so that one live alternative found by a moderate search settles it before others are proved empty in full."""
    undecided, step = alternatives, min(CHEAP_SEARCH, limit)
    while undecided:
        left = []
        for alternative in undecided:
            found = _decide(alternative, step)
            if found is False:
                return False
            if found is None:
                left.append(alternative)
        if left and step == limit:
            return None
        undecided, step = left, min(step * DEEPER, limit)
    return True


def _mark_live(term: Rx, found: bytes) -> None:
    """Memoize `term`, and every derivative along its string `found` as it is built (`derivative` passes the rest of
    the string on), as non-empty: a state proved live by a witness keeps a successor known live, so forbidding what a
    walk cannot decide never strands it. Nothing is derived here: a walk builds only the derivatives it takes."""
    if term._empty is None:
        term._empty = False
    if found and term._pending is None and not term.plain:  # plain terms are live unless NOTHING
        term._pending = found


def _pass_on(term: Rx, byte: int, found: Rx) -> None:
    """`found` = d(term, byte): live when `byte` starts `term`'s pending string, which then continues from it."""
    pending = term._pending
    if pending[0] == byte:
        _mark_live(found, pending[1:])


def _search_empty(term: Rx, limit: int) -> bool | None:
    """Depth-first search for a nullable derivative; every term on the path found is non-empty, and when
    none is found every term explored is empty (all it reaches was explored): both are memoized. None
    (nothing memoized) when it explores more than `limit` terms."""
    seen, explored, path = {term.id}, [term], [(term, _by_priority(term.classes))]
    while path:
        t, blocks = path[-1]
        mask = next(blocks, None)
        if mask is None:
            path.pop()
            continue
        d = derivative(t, lowest_byte(mask))
        if d.id in seen or d._empty is True:
            continue
        if d.nullable or d._empty is False or (d.plain and d is not NOTHING) or _witnessed(d):
            for on_path, _ in path:
                on_path._empty = False
            return False
        seen.add(d.id)
        explored.append(d)
        if len(seen) > limit:
            return None
        path.append((d, _by_priority(d.classes)))
    for t in explored:
        t._empty = True
    return True


def _witnessed(term: Rx) -> bool:
    """Whether `term` has a witness found by structure (marked live along it): the search stops there."""
    found = witness(term)
    if found is not None:
        _mark_live(term, found)
    return found is not None


_UNFILLED = object()  # a branch of a pick whose item its owner no longer allows
_NO_WITNESS = b"<none>"  # marks a term whose witness `witness` cannot find by structure


def witness(term: Rx) -> bytes | None:
    """A short string of `term` found by structure, checked by `matches`; None where that would need a
    search (a complement, an intersection whose parts' witnesses all fail). Memoized on the term.

    Intersections of objects with complements (`not`, `oneOf`, `if`) are mostly non-empty with the
    shortest object of their positive part as proof: one check instead of a search of their derivatives.
    """
    found = term._witness
    if found is None and _scratch:  # a rule is open: what is found now may miss its recursive branches
        found = _scratch[-1].get(term.id)
        if found is None:
            found = _scratch[-1][term.id] = _find_witness(term)
    elif found is None:
        found = term._witness = _find_witness(term)
    return None if found is _NO_WITNESS else found


def _witness_or_none(term: Rx) -> bytes:
    found = witness(term)
    return _NO_WITNESS if found is None else found


_scratch: list[dict] = []  # witnesses found while a rule is being unfolded, forgotten when the outermost closes


def _call_witness(term: Rx) -> bytes:
    """A call's witness: its body's, where a call of a rule open on the way has none. The outermost rule's is exact
    (a shortest string never contains a shorter one of the same rule), the others' are kept apart (`_scratch`)."""
    _scratch.append(_scratch[-1] if _scratch else {})
    try:
        return _unfold(term, "witness", _witness_or_none, lambda: _NO_WITNESS)
    finally:
        _scratch.pop()


def _find_witness(term: Rx) -> bytes:
    if term.nullable:
        return b""
    kind, args = term.kind, term.args
    if kind == "bytes":
        return bytes([_preferred_byte(args[0])])
    if kind == "seq":
        parts = []
        while term.kind == "seq":
            parts.append(witness(term.args[0]))
            term = term.args[1]
        parts.append(witness(term))
        return _NO_WITNESS if any(p is None for p in parts) else b"".join(parts)
    if kind == "alt":
        return _shortest(witness(t) for t in args)
    if kind == "repeat":
        child = witness(args[0])
        return _NO_WITNESS if child is None else child * args[1]
    if kind == "anyorder":
        sep, extra, required, optional = _any_order_parts(term)
        if not required:
            return _shortest(witness(t) for t in (*optional, extra))
        parts = [witness(t) for t in (sep, *required)]
        return _NO_WITNESS if any(p is None for p in parts) else parts[0].join(parts[1:])
    if kind == "pick":
        found = (_pick_branch(b, args[1], witness, lambda ws: None if None in ws else b"".join(ws))
                 for b in _branches(args[0]))
        return _shortest(w for w in found if w is not _UNFILLED)
    if kind == "and":
        for part in args:
            found = witness(part)
            if found is not None and all(matches(other, found) for other in args if other is not part):
                return found
    if kind == "call":
        return _call_witness(term)
    return _NO_WITNESS  # nothing, not, and without a witness


def _pick_branch(branch: Rx, owner: Rx, of_part, combine):
    """`combine([of_part(p) for p in the parts of `branch` before its hole, and what fills the hole])`;
    _UNFILLED where `owner` no longer allows the branch's item."""
    parts = _chain(branch)
    item = parts[-1].args[0]
    if item not in _fillable(owner):
        return _UNFILLED
    return combine([of_part(p) for p in (*parts[:-1], _after(item, owner))])


def _shortest(candidates) -> bytes:
    return min((c for c in candidates if c is not None), key=len, default=_NO_WITNESS)


def _preferred_byte(mask: int) -> int:
    """A byte of `mask`: printable ASCII first (as `_by_priority`)."""
    printable = ((1 << 0x7F) - 1) ^ ((1 << 0x20) - 1)
    return lowest_byte(mask & printable) if mask & printable else lowest_byte(mask)


def _by_priority(classes: tuple[int, ...]):
    """Blocks with printable ASCII first (JSON punctuation ends strings and values soonest)."""
    printable = ((1 << 0x7F) - 1) ^ ((1 << 0x20) - 1)
    return iter(sorted(classes, key=lambda m: lowest_byte(m & printable) if m & printable else 256 + lowest_byte(m)))


def matches(term: Rx, data: bytes | str) -> bool:
    """Whether `term` matches all of `data`."""
    data = data.encode() if isinstance(data, str) else data
    for byte in data:
        term = derivative(term, byte)
        if term is NOTHING:
            return False
    return term.nullable


def size(term: Rx) -> int:
    """Number of distinct subterms (the DAG size)."""
    seen, stack = set(), [term]
    while stack:
        t = stack.pop()
        if t.id not in seen:
            seen.add(t.id)
            stack.extend(t.children)
    return len(seen)

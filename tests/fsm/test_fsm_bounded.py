"""Bounded work: numeric ranges, long strings and counted repeats compile in work proportional to
their size (counted in calls, terms and states, never in seconds), and stay exact (Python's own
comparisons and `re` are the oracles)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import fsm
from fsm import json_terms as jt
from fsm import rx

pytestmark = pytest.mark.usefixtures("fresh_fsm_caches")  # work counts must not depend on test order


def _count_calls(monkeypatch, module, name: str) -> list[int]:
    calls, inner = [0], getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _terms_created(build) -> int:
    before = next(rx._ids)
    build()
    return next(rx._ids) - before


def _integer_samples(low, high, rng: random.Random, n: int = 60) -> list[int]:
    """Integers around and inside [low, high] (either may be None), borders included."""
    lo, hi = (low if low is not None else -(10**25)), (high if high is not None else 10**25)
    near = [b + d for b in (lo, hi, 0) for d in (-11, -10, -1, 0, 1, 9, 10)]
    spread = [rng.randint(lo - abs(lo) - 5, hi + abs(hi) + 5) for _ in range(n)]
    same_digits = [
        int(
            str(abs(b))[: rng.randint(1, len(str(abs(b))))]
            + "".join(rng.choice("0123456789") for _ in range(len(str(abs(b))) - 1))
        )
        * (1 if b >= 0 else -1)
        for b in (lo, hi)
        for _ in range(n // 4)
        if b
    ]
    return near + spread + same_digits


BOUNDS = [(0, 0), (5, 5), (0, 9), (7, 123), (-5, 5), (-123, -7), (100, 100000), (19, 91), (-10**18, 10**18),
          (-9223372036854775808, 9223372036854775807), (None, 42), (-42, None), (10**12 + 7, None), (None, -(10**9)),
          (999, 1001), (1000, 9999), (12345678901234567890, 12345678901234567899)]


@pytest.mark.parametrize("low,high", BOUNDS)
def test_integer_ranges_accept_exactly_the_integers_in_range(low, high):
    term = jt.integer_range(low, high)
    for value in _integer_samples(low, high, random.Random(f"{low},{high}")):
        inside = (low is None or value >= low) and (high is None or value <= high)
        assert rx.matches(term, str(value)) == inside, (low, high, value)
    assert not rx.matches(term, "01") and not rx.matches(term, "-0") and not rx.matches(term, "+1")


def test_integer_range_work_is_linear_in_the_number_of_digits(monkeypatch):
    calls = _count_calls(monkeypatch, jt, "_same_length")
    counts = {}
    for digits in (10, 20, 40, 80):
        calls[0] = 0
        terms = _terms_created(lambda: jt.integer_range(-(10**digits) + 12345, 10**digits - 54321))
        counts[digits] = (calls[0], terms)
    assert all(c <= 4 for c, _ in counts.values())  # no recursion at all: one call per length class
    assert counts[80][1] <= 2.5 * counts[40][1] <= 2.5**2 * counts[20][1], counts  # linear, not doubling


def test_huge_numeric_bounds_compile_and_walk(smol_tokenizer):
    before = next(rx._ids)
    guide = fsm.Guide.from_schema({"type": "integer", "minimum": -1e300}, smol_tokenizer)
    assert next(rx._ids) - before < 50_000
    assert guide.mask().any()
    term = fsm.compile_schema({"type": "integer", "minimum": -1e300})
    bound = int(-1e300)  # Python compares int and float exactly, as jsonschema does
    assert rx.matches(term, str(bound)) and not rx.matches(term, str(bound - 1))
    assert bound >= -1e300 and not bound - 1 >= -1e300
    assert rx.matches(term, str(10**400))


def test_int64_bounds_walked_through_the_guide(smol_tokenizer):
    schema = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
    rng = random.Random(7)
    for value in [-(2**63), 2**63 - 1, -(2**63) - 1, 2**63, 0, -1] + [rng.randint(-(2**64), 2**64) for _ in range(20)]:
        guide = fsm.Guide.from_schema(schema, smol_tokenizer)
        ok = True
        for token in smol_tokenizer.encode(str(value), add_special_tokens=False):
            if not guide.mask()[token]:
                ok = False
                break
            guide.advance(token)
        assert (ok and guide.is_final()) == (-(2**63) <= value <= 2**63 - 1), value


# -- long strings and counted repeats ------------------------------------------------------------


def _first_mask_work(build) -> tuple[int, int]:
    before = next(rx._ids)
    guide = build()
    assert guide.mask().any()
    return next(rx._ids) - before, guide.index.dfa.n_states


@pytest.mark.parametrize("length", [1000, 100_000, 10**7])
def test_long_string_first_mask_costs_the_same_for_any_length(smol_tokenizer, length):
    terms, states = _first_mask_work(
        lambda: fsm.Guide.from_schema({"type": "string", "maxLength": length}, smol_tokenizer)
    )
    assert terms < 2_000 and states < 100, (terms, states)  # no unrolled chain, no crawl


@pytest.mark.parametrize("pattern", ["a{1000000}", "(ab|cd){200000}x", "[a-z]{3,5000000}"])
def test_counted_repeat_first_mask_is_bounded(smol_tokenizer, pattern):
    terms, states = _first_mask_work(lambda: fsm.Guide.from_regex(pattern, smol_tokenizer))
    assert terms < 2_000 and states < 100, (terms, states)


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 100_000}, {"type": "string", "minLength": 100_000},
                                    {"type": "string", "pattern": "^[a-z]*$", "minLength": 2_000}])
def test_walking_a_long_string_costs_a_bounded_amount_per_token(smol_tokenizer, schema):
    guide, rng = fsm.Guide.from_schema(schema, smol_tokenizer), random.Random(3)
    guide.mask()
    before, states = next(rx._ids), guide.index.dfa.n_states
    for _ in range(40):
        allowed = [t for t in guide.allowed() if t not in guide.eos_token_ids]
        guide.advance(rng.choice(allowed))
    per_token = (next(rx._ids) - before) / 40, (guide.index.dfa.n_states - states) / 40
    assert per_token[0] < 400 and per_token[1] < 150, per_token  # what one token's walk may discover


@pytest.mark.parametrize(
    "pattern", ["\U00040000{2}x|ab", "[\U00040000-\U00040010]+y?", "(\U00040000|q)z{1,40}", "[a-c\U00040000]{2,6}"]
)
def test_structural_liveness_agrees_with_the_exact_crawl(smol_tokenizer, pattern):
    guide = fsm.Guide.from_regex(pattern, smol_tokenizer)
    index, seen, todo = guide.index, {0}, [0]
    while todo:  # every token-reachable state, so the crawl's answer covers all of them
        info = index.info(todo.pop())
        for state in info.next_states.tolist():
            if state >= 0 and state not in seen:
                seen.add(state)
                todo.append(state)
    exact = index._live._crawl_all()
    fast = index._live.keep(np.asarray(sorted(seen)))
    assert (fast is None and exact[sorted(seen)].all()) or (fast == exact[sorted(seen)]).all()


@pytest.mark.parametrize(
    "bound,message",
    [(10**5000, "more than 4000 digits"), (float("inf"), "finite"), (float("nan"), "finite")],
    ids=["5000-digits", "inf", "nan"],
)
def test_unusable_numeric_bounds_are_clear_schema_errors(bound, message):
    for kind in ("integer", "number"):
        with pytest.raises(fsm.SchemaError, match=message):
            fsm.compile_schema({"type": "object", "properties": {"x": {"type": kind, "maximum": bound}}})

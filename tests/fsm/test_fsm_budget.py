"""Budgets and bounded caches: past a limit a clear GuideBudgetError (never a hang); caches never grow
past their bounds. Work is counted in terms and states, time through an injected clock."""

from __future__ import annotations

import gc
import itertools
from contextlib import contextmanager

import pytest

import fsm
from fsm.budget import Budget, GuideBudgetError
from fsm.bounded_cache import BoundedCache
from fsm.guide import INDEXES

pytestmark = pytest.mark.usefixtures("fresh_fsm_caches")  # work counts must not depend on test order


def _unique_bound(salt: int) -> int:
    """A 250-digit bound no other test builds (terms are interned: only new ones cost budget)."""
    return -(10**250) - 1_000_003 * salt - 77_777_777


def test_compile_past_its_term_budget_names_the_subschema():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": _unique_bound(1)}},
        "required": ["a"],
    }
    fsm.compile_schema({"type": "object"})  # the compiler's shared terms exist before the budgeted call
    with pytest.raises(GuideBudgetError, match=r"more than 100 terms.* at #/properties/a$") as caught:
        fsm.compile_schema(schema, budget=Budget(max_terms=100))
    assert isinstance(caught.value, fsm.SchemaError) and caught.value.pointer == "#/properties/a"
    assert fsm.compile_schema(schema) is not None  # the default budget is enough


@contextmanager
def _collections(thresholds: tuple | None):
    """Garbage collections at these thresholds (None: none at all), then as before."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds) if thresholds else gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.set_threshold(*before)


def test_the_term_budget_lands_at_the_same_subschema_however_often_garbage_is_collected():
    """Terms are interned weakly, and a collection decides when dropped ones in cycles are freed: the count of new
    terms must not depend on it (the compiler's shared terms are cached; a compile holds the terms it makes)."""
    from fsm.caches import clear_caches

    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": _unique_bound(3)}}}
    pointers = []
    for thresholds in [(1, 1, 1), None, (700, 10, 10)]:
        clear_caches()
        fsm.compile_schema({"type": "object"})  # dropped: garbage until a collection, at each thresholds' pace
        with _collections(thresholds), pytest.raises(GuideBudgetError, match="more than 100 terms") as caught:
            fsm.compile_schema(schema, budget=Budget(max_terms=100))
        pointers.append(caught.value.pointer)
    assert pointers == ["#/properties/a"] * 3


def test_a_budgeted_task_holds_the_terms_it_makes_until_it_ends():
    """A term the task dropped is the same term when it is built again (counted once), whatever was collected."""
    from fsm import rx
    from fsm.budget import metered

    def spelled(text: str) -> rx.Rx:  # `rx.literal` without its cache, which would keep the term alive
        return rx.seq(*(rx.byte_set(1 << b) for b in text.encode()))

    text = f"held {_unique_bound(4)}"
    with metered(None, "a task") as meter:
        first = spelled(text).id  # the term itself is dropped at once
        made = meter.terms
        gc.collect()
        assert spelled(text).id == first and meter.terms == made
    del meter  # it holds the task's terms
    gc.collect()
    assert spelled(text).id != first  # after the task, a dropped term is freed as before


def test_compile_past_its_time_budget_with_an_injected_clock():
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731 - one second per look at the clock
    with pytest.raises(GuideBudgetError, match="longer than 0.5 s"):
        fsm.compile_schema(
            {"type": "array", "items": {"type": "integer", "minimum": _unique_bound(2)}},
            budget=Budget(max_seconds=0.5, clock=clock),
        )


def test_a_paused_compile_spends_none_of_its_time_budget():
    """A compile's time is its thread's CPU time: a pause (SIGSTOP, a wait for a busy core; here a sleep) spends none
    of it. Control: the same pause on a wall clock goes past the budget."""
    import time

    from fsm.budget import Meter

    assert Budget().clock is time.thread_time
    paused = Meter(Budget(max_seconds=0.05), "a paused compile")
    walled = Meter(Budget(max_seconds=0.05, clock=time.monotonic), "a compile on the wall clock")
    time.sleep(0.2)  # no CPU spent: the thread is off its core, as a stopped process is
    paused.check_clock()
    with pytest.raises(GuideBudgetError, match="longer than 0.05 s"):
        walled.check_clock()


def test_a_hopeless_string_stops_at_its_budget_instead_of_crawling(smol_tokenizer):
    schema = {"type": "string", "pattern": "^[a-z]*$", "minLength": 50_000}  # witnesses 50,000 characters long
    with pytest.raises(GuideBudgetError, match="Budget.max_terms"):
        guide = fsm.Guide.from_schema(schema, smol_tokenizer, budget=Budget(max_terms=30_000, max_seconds=float("inf")))
        guide.mask()


def test_first_visits_stop_at_the_state_budget_and_the_guide_stays_consistent(smol_tokenizer):
    guide = fsm.Guide.from_regex("a{1000000}", smol_tokenizer, budget=Budget(max_states=60))
    long_a = max(
        (t for t in guide.allowed() if t not in guide.eos_token_ids),
        key=lambda t: len(guide.index.vocabulary.token_bytes[t]),
    )
    with pytest.raises(GuideBudgetError, match=r"regex 'a\{1000000\}' needs more than 60 states"):
        for _ in range(1000):
            last_good = guide.copy()
            guide.advance(long_a)
            guide.mask()
    assert guide.index.dfa.n_states <= 60
    with pytest.raises(GuideBudgetError):  # the same answer on a second try
        guide.mask()
    assert last_good.mask()[long_a] and last_good.index.info(last_good.state).next_states.max() >= 0


def test_index_cache_never_exceeds_its_bounds(smol_tokenizer):
    for i in range(3 * INDEXES.max_entries):
        guide = fsm.Guide.from_schema(
            {"type": "object", "properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]}, smol_tokenizer
        )
        guide.mask()
        assert len(INDEXES) <= INDEXES.max_entries and INDEXES.nbytes <= INDEXES.max_bytes + guide.index.nbytes


def test_bounded_cache_evicts_least_recently_used_by_count_and_bytes():
    cache = BoundedCache(max_entries=3, max_bytes=10, size_of=len)
    for key in "abc":
        cache.get_or_build(key, lambda: b"xx")
    cache.get_or_build("a", lambda: b"never built")  # a is now the most recent
    cache.get_or_build("d", lambda: b"xx")  # evicts b (least recently used)
    assert set(cache._entries) == {"a", "c", "d"}
    cache.get_or_build("e", lambda: b"x" * 9)  # 15 bytes > 10: the oldest go until it fits
    assert list(cache._entries) == ["e"] and cache.nbytes == 9
    assert cache.get_or_build("f", lambda: b"x" * 50) == b"x" * 50 and len(cache) == 1  # a big entry alone still fits


def test_an_index_keeps_its_visited_states_within_its_byte_bound(smol_tokenizer, monkeypatch):
    import random

    from fsm import index as index_module

    monkeypatch.setattr(index_module, "MAX_CACHED_BYTES", 3 << 20)  # about seven states that allow every token
    # "." spans bytes that SmolLM2 has no single-byte token for, so no state here is proved token-live by its term
    # (`fsm.liveness.Spelling`): each takes the checked path and holds its token and end-state arrays (~0.44 MB).
    schema = {"type": "string", "pattern": "^.*$", "maxLength": 777_777}
    guide = fsm.Guide.from_schema(schema, smol_tokenizer)
    rng, path = random.Random(5), []
    for _ in range(25):
        path.append((guide.state, guide.allowed()))
        guide.advance(rng.choice([t for t in guide.allowed() if t not in guide.eos_token_ids]))
        assert guide.index._info_bytes[0] <= 3 << 20 and len(guide.index._states) >= 1
    assert len(guide.index._states) < 25
    for state, allowed in path:  # evicted states are rebuilt, with the same answers
        assert fsm.Guide(guide.index, state).allowed() == allowed


class _Clock:
    """A clock that runs `rate` seconds per look once `rate` is set: a loaded machine at its worst."""

    def __init__(self):
        self.now, self.rate = 0.0, 0.0

    def __call__(self) -> float:
        self.now += self.rate
        return self.now


def _searched(longest: int, excluded: str) -> dict:
    """Option 0 minus U(option 1): first visits decide intersections with a complement (hundreds of new terms)."""
    return {"oneOf": [{"type": "string", "pattern": "^[ab]*$", "minLength": 2, "maxLength": longest},
                      {"type": "string", "pattern": excluded}]}


def _masks_along(guide, text: str) -> list:
    out = []
    for token in guide.index.vocabulary.encode(text):
        out.append(guide.mask().clone())
        guide.advance(token)
    return out + [guide.mask().clone()]


def test_a_loaded_machine_never_changes_a_mask(smol_tokenizer):
    """First visits (during generation) are bounded by work alone: a clock that jumps an hour at every look changes
    no mask. Control: the same walk under a timed meter stops with GuideBudgetError."""
    from fsm.budget import metered

    term = fsm.compile_schema(_searched(30, "(ab){2}b"))
    text = '"abbabbabbaab"'
    clock = _Clock()
    slow = fsm.Guide.from_rx(term, smol_tokenizer, budget=Budget(max_seconds=60.0, clock=clock))
    clock.rate = 3600.0  # from here on: every look at the clock is an hour later
    loaded = _masks_along(slow, text)
    assert slow.is_final()
    fresh = _masks_along(fsm.Guide.from_rx(term, smol_tokenizer, budget=Budget(max_seconds=61.0)), text)
    assert len(loaded) == len(fresh) and all(a.equal(b) for a, b in zip(loaded, fresh))
    control = fsm.Guide.from_rx(fsm.compile_schema(_searched(31, "(ba){2}a")), smol_tokenizer,
                                budget=Budget(max_seconds=60.0, clock=clock))
    with pytest.raises(GuideBudgetError, match="Budget.max_seconds"):
        with metered(Budget(max_seconds=60.0, clock=clock), "a timed walk"):
            _masks_along(control, text)

"""assisted.policy: constant and transformers' heuristic candidate-length schedules."""

import pytest

from assisted.policy import SCHEDULES, Constant, Heuristic, make_policy


def test_constant_never_moves():
    policy = Constant(4)
    for drafted, accepted in [(4, 4), (4, 0), (2, 1)]:
        policy.update(drafted, accepted)
        assert policy.k == 4


def test_heuristic_adds_two_on_full_acceptance_and_drops_one_otherwise():
    policy = Heuristic(5)
    policy.update(5, 5)
    assert policy.k == 7
    policy.update(7, 3)
    assert policy.k == 6
    policy.update(6, 6)
    assert policy.k == 8


def test_heuristic_never_goes_below_one():
    policy = Heuristic(2)
    for _ in range(5):
        policy.update(policy.k, 0)
    assert policy.k == 1


def test_a_draft_cut_short_but_fully_accepted_counts_as_full_acceptance():
    policy = Heuristic(5)
    policy.update(2, 2)  # drafting stopped early (EOS, final state, budget): all of it was accepted
    assert policy.k == 7


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_make_policy_starts_at_the_given_k(name):
    assert make_policy(name, 3).k == 3


def test_only_assistant_tokens_up_to_the_first_rejection_are_judged():
    from assisted.generate import _judged

    assert _judged((False, False, False), 3) == (3, 3)  # all accepted
    assert _judged((False, False, False), 1) == (2, 1)  # second rejected, third never judged
    assert _judged((True, False, False), 0) == (0, 0)  # a forced token rejected first: no signal
    assert _judged((False, True, False), 1) == (1, 1)  # the forced token was rejected, not the assistant's
    assert _judged((), 0) == (0, 0)

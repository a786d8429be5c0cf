"""assisted.policy: constant, transformers' heuristic, and the cost-aware `Auto` candidate-length schedules."""

import random

import pytest

from assisted.policy import (SCHEDULES, Auto, AutoConfig, AutoState, Constant, Estimates, Heuristic, StepCost, choose,
                             estimate, make_policy, observe)


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


def test_heuristic_ignores_steps_without_judged_tokens():
    policy = Heuristic(3)
    policy.update(0, 0, StepCost(1, 0.1, 0, 0.0))  # k = 0 or a forced-only step: no evidence
    assert policy.k == 3 and policy.estimates() is None


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


# --- the cost-aware policy on synthetic traces -------------------------------------------------------------
# A simulated decode loop: the target's forward over n tokens costs target(n) seconds, each assistant token
# `draft` seconds, and each assistant token is accepted with probability acceptance(step) (seeded, so every
# trace is deterministic). Forced tokens are left out: they are free and never judged.


def simulate(policy, steps, target, draft, acceptance, seed=0):
    """Drive `policy` for `steps` steps; returns the k it chose at each step."""
    rng, trace = random.Random(seed), []
    for step in range(steps):
        k = policy.k
        trace.append(k)
        judged = accepted = 0
        while judged < k:
            judged += 1
            if rng.random() >= acceptance(step):
                break
            accepted += 1
        policy.update(judged, accepted, StepCost(k + 1, target(k + 1), k, draft * k))
    return trace


def test_cheap_verifier_and_good_acceptance_drive_k_up():
    trace = simulate(Auto(5), 60, target=lambda n: 0.100, draft=0.005, acceptance=lambda _: 0.9)
    assert trace[:3] == [5, 5, 0] and trace[3] > 5  # warm-up: prefill, a forward verifying drafts, one at k = 0
    late = sorted(trace[20:])
    assert late[0] >= 8 and late[len(late) // 2] >= 10 and late[-1] <= AutoConfig().k_max


def test_expensive_verifier_and_poor_acceptance_drive_k_to_zero_without_probes():
    trace = simulate(Auto(5), 60, target=lambda n: 0.01 + 0.1 * n, draft=0.02, acceptance=lambda _: 0.2)
    assert trace[3:] == [0] * 57  # verifying n tokens costs n steps: drafting cannot pay, so no probe either


def test_cheap_verifier_and_poor_acceptance_decode_plainly_with_probes():
    trace = simulate(Auto(5), 60, target=lambda n: 0.1 + 0.001 * n, draft=0.05, acceptance=lambda _: 0.1)
    late = trace[10:]
    assert late.count(0) >= 0.8 * len(late) and set(late) == {0, AutoConfig.probe_k}


def test_when_acceptance_returns_the_probes_notice_and_k_goes_back_up():
    def acceptance(step):
        return 0.05 if step < 60 else 0.95

    trace = simulate(Auto(5), 120, target=lambda n: 0.1 + 0.02 * n, draft=0.01, acceptance=acceptance)
    assert trace[40:60].count(0) >= 15  # poor acceptance: k = 0 with probes
    assert min(trace[100:]) >= 4  # after a probe, speculation pays again


def test_probes_back_off_while_they_change_nothing():
    cfg = AutoConfig()
    trace = simulate(Auto(3), 200, target=lambda n: 0.1 + 0.001 * n, draft=0.05, acceptance=lambda _: 0.0)
    probes = [i for i in range(4, len(trace)) if trace[i] > 0]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    waits = [cfg.probe_every * 2 ** min(i, cfg.probe_backoff) + 1 for i in range(1, len(gaps) + 1)]
    assert len(probes) >= 4 and gaps == waits  # 17, 33, 65, 65: each failed probe doubles the wait, up to 8x


def test_the_cost_table_interpolates_measured_forwards_and_skips_both_prefills():
    cfg, state = AutoConfig(), AutoState(k0=4)
    for n, seconds in [(50, 9.0), (1, 0.4), (2, 0.8), (6, 1.2), (1, 0.4)]:  # the first forward is the prefill
        state = observe(state, 0, 0, StepCost(n, seconds, 0, 0.0), cfg)
    assert state.costs.measured() == (1, 2, 6)
    curve = estimate(state, cfg).target_seconds
    assert len(curve) == cfg.k_max + 2 and curve[0] == 0.0
    assert curve[1:3] == pytest.approx((0.4, 0.8)) and curve[4] == pytest.approx(1.0)  # between 2 and 6: a line
    assert curve[10] == pytest.approx(1.2 + 4 * 0.1)  # past 6: the last slope
    state = observe(state, 0, 0, StepCost(4, 0.5, 0, 0.0), cfg)  # a noisy, too cheap timing at n = 4 ...
    curve = estimate(state, cfg).target_seconds
    assert curve[4] == pytest.approx(0.8) and all(b >= a for a, b in zip(curve, curve[1:]))  # ... cannot lower it
    for seconds in [9.0, 0.02, 0.04]:  # the first drafting step holds the assistant's prefill
        state = observe(state, 2, 2, StepCost(3, 1.0, 2, 2 * seconds), cfg)
    assert state.costs.draft_per_token == pytest.approx(0.9 * 0.02 + 0.1 * 0.04)


def test_acceptance_is_a_decayed_rate_with_a_prior():
    cfg, state = AutoConfig(), AutoState(k0=4)
    for _ in range(30):
        state = observe(state, 4, 1, None, cfg)
    weight = sum(cfg.acceptance_decay**i for i in range(30))  # 1 of 4 accepted per step, plus the prior
    prior = cfg.acceptance_prior * cfg.prior_weight
    assert estimate(state, cfg).acceptance == pytest.approx((weight + prior) / (4 * weight + cfg.prior_weight))


def test_best_k_maximizes_expected_tokens_per_second():
    flat = Estimates(target_seconds=(0.0,) + (0.1,) * 17, draft_per_token=0.0, acceptance=0.5)
    assert flat.best_k(16) == 16  # free drafts, free verification: draft as much as allowed
    steep = Estimates(target_seconds=tuple(0.1 * n for n in range(18)), draft_per_token=0.01, acceptance=0.9)
    assert steep.best_k(16) == 0  # each verified token costs as much as decoding it
    assert flat.expected_tokens(2) == 1.75 and Estimates(flat.target_seconds, 0.01, 1.0).expected_tokens(3) == 4.0


def test_auto_warms_up_at_the_starting_k_and_is_a_pure_function_of_its_state():
    cfg = AutoConfig()
    assert choose(AutoState(k0=7), cfg) == 7
    policy = Auto(7)
    for step in range(3):
        assert policy.k == (0 if step == 2 else 7)  # the warm-up times one plain step as well
        k = policy.k
        policy.update(k, k, StepCost(k + 1, 0.05, k, 0.0001 * k))
    assert choose(policy.state, cfg) == policy.k == cfg.k_max  # near-free drafts, everything accepted


def test_costs_a_call_measured_replace_the_warm_up_of_the_next():
    first = Auto(5)
    simulate(first, 30, target=lambda n: 0.4 * n, draft=0.2, acceptance=lambda _: 0.3)
    costs = first.learned()
    assert costs.measured() and costs.draft_per_token == pytest.approx(0.2)
    assert Auto(5, costs=costs).k == 0  # compute-bound verifier: plain decoding from the first step
    cheap = Auto(5)
    simulate(cheap, 30, target=lambda n: 0.1, draft=0.001, acceptance=lambda _: 0.95)
    trace = simulate(Auto(5, costs=cheap.learned()), 3, target=lambda n: 0.1, draft=0.001, acceptance=lambda _: 1.0)
    assert trace[0] > 5 and min(trace[1:]) > 5  # no warm-up at the starting k, no step at k = 0
    assert isinstance(make_policy("auto", 5, costs), Auto) and make_policy("auto", 5, costs).k == 0

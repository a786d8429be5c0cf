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
    assert trace[:5] == [5, 5, 0, 5, trace[4]] and trace[4] > 5  # warm-up: prefill + 3 timed forwards, one at k = 0
    late = sorted(trace[20:])
    assert late[0] >= 8 and late[len(late) // 2] >= 10 and late[-1] <= AutoConfig().k_max


def test_expensive_verifier_and_poor_acceptance_drive_k_to_zero():
    trace = simulate(Auto(5), 60, target=lambda n: 0.01 + 0.1 * n, draft=0.02, acceptance=lambda _: 0.2)
    late = trace[20:]
    assert late.count(0) >= 0.8 * len(late)  # plain decoding, apart from ...
    assert set(late) <= {0, AutoConfig.probe_k}  # ... an occasional probe
    assert AutoConfig.probe_k in late


def test_when_acceptance_returns_the_probes_notice_and_k_goes_back_up():
    def acceptance(step):
        return 0.05 if step < 60 else 0.95

    trace = simulate(Auto(5), 120, target=lambda n: 0.1 + 0.02 * n, draft=0.01, acceptance=acceptance)
    assert trace[40:60].count(0) >= 15  # poor acceptance: k = 0 with probes
    assert min(trace[90:]) >= 4  # after a probe or two, speculation pays again


def test_k_zero_probes_every_probe_every_steps():
    cfg = AutoConfig()
    trace = simulate(Auto(3), 80, target=lambda n: 0.01 + 0.1 * n, draft=0.05, acceptance=lambda _: 0.0)
    zeros = [i for i, k in enumerate(trace) if k == 0]
    probes = [i for i in range(zeros[0], len(trace)) if trace[i] > 0]
    assert probes and all(b - a == cfg.probe_every + 1 for a, b in zip(probes, probes[1:]))


def test_the_cost_fit_recovers_a_line_and_acceptance_follows_the_evidence():
    cfg, state = AutoConfig(), AutoState(k0=4)
    for n in [1, 50, 1, 2, 3, 5, 8, 2, 6]:  # the first forward (prefill, n=50) is not fitted
        state = observe(state, 0, 0, StepCost(n, 0.2 + 0.03 * n, 0, 0.0), cfg)
    for _ in range(30):
        state = observe(state, 4, 1, StepCost(5, 0.35, 4, 0.04), cfg)
    est = estimate(state, cfg)
    assert abs(est.target_fixed - 0.2) < 5e-3 and abs(est.target_per_token - 0.03) < 1e-3  # the ridge: a nudge
    assert abs(est.draft_per_token - 0.01) < 1e-12
    weight = sum(cfg.acceptance_decay**i for i in range(30))  # 1 of 4 accepted per step, plus the prior
    assert est.acceptance == pytest.approx((weight + cfg.acceptance_prior * cfg.prior_weight) / (4 * weight + 2))


def test_best_k_maximizes_expected_tokens_per_second():
    flat = Estimates(target_fixed=0.1, target_per_token=0.0, draft_per_token=0.0, acceptance=0.5)
    assert flat.best_k(16) == 16  # free drafts, free verification: draft as much as allowed
    steep = Estimates(target_fixed=0.0, target_per_token=0.1, draft_per_token=0.01, acceptance=0.9)
    assert steep.best_k(16) == 0  # each verified token costs as much as decoding it
    assert Estimates(0.1, 0.0, 0.01, 1.0).expected_tokens(3) == 4.0
    assert Estimates(0.1, 0.0, 0.01, 0.5).expected_tokens(2) == 1.75


def test_auto_warms_up_at_the_starting_k_and_is_a_pure_function_of_its_state():
    cfg = AutoConfig()
    assert choose(AutoState(k0=7), cfg) == 7
    policy = Auto(7)
    for step in range(cfg.warmup + 1):
        assert policy.k == (0 if step == 2 else 7)  # the warm-up times one plain step to fit the cost line
        k = policy.k
        policy.update(k, k, StepCost(k + 1, 0.05, k, 0.0001 * k))
    assert choose(policy.state, cfg) == policy.k == cfg.k_max  # near-free drafts, everything accepted

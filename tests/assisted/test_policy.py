"""assisted.policy.draft_policy: constant, transformers' heuristic, and the cost-aware `Auto` candidate-length
schedules."""

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from assisted.policy.auto import (AutoState, Calibration, _wait, choose, estimate, observe, observe_leaf, safe_drafts,
                                  upside, warmed_up)
from assisted.policy.costs import CostTable
from assisted.policy.draft_policy import (SCHEDULES, Auto, AutoConfig, Constant, Estimates, Heuristic, StepCost,
                                          make_policy)
from drafting.base import Draft


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


def test_only_model_drafts_up_to_the_first_rejection_are_judged():
    from assisted.steps import judge as _judged

    assert _judged((False, False, False), 3) == (3, 3)  # all accepted
    assert _judged((False, False, False), 1) == (2, 1)  # second rejected, third never judged
    assert _judged((True, False, False), 0) == (0, 0)  # a forced token rejected first: no signal
    assert _judged((False, True, False), 1) == (1, 1)  # the forced token was rejected, not the assistant's
    assert _judged((), 0) == (0, 0)
    draft = Draft((5, 6, 7), ("assistant", "forced", "lookup"), None, None, (0.5, float("nan"), float("nan")), False)
    assert draft.model_confidence[0] == 0.5 and len(draft.model_confidence) == 2


# --- the cost-aware policy on synthetic traces -------------------------------------------------------------
# A simulated decode loop: the target's forward over n tokens costs target(n) seconds and each assistant token
# `draft` seconds. The assistant's confidence in its i-th token of a step is confidence(step), and the target
# accepts that token with probability acceptance(confidence) (a calibrated assistant by default). Draws are
# seeded, so every trace is deterministic. Forced tokens are left out: they are free and never judged.

CPU = dict(xs=[1, 2, 4, 8, 16], ys=[0.375, 0.722, 1.107, 1.271, 1.708])  # Qwen2.5-Coder-1.5B, this 2-core CPU


def cpu_target(n):
    slope = (CPU["ys"][-1] - CPU["ys"][-2]) / (CPU["xs"][-1] - CPU["xs"][-2])
    return float(np.interp(n, CPU["xs"], CPU["ys"])) + slope * max(n - CPU["xs"][-1], 0)


def simulate(policy, steps, target, draft, confidence, acceptance=lambda c: c, seed=0):
    """Drive `policy` for `steps` steps; returns (k asked, drafts verified) per step."""
    rng, trace = random.Random(seed), []
    for step in range(steps):
        k, drafts, kept = policy.k, [], None
        while len(drafts) < k and kept is None:
            drafts.append(confidence(step))
            kept = policy.cut(tuple(drafts))
        verified = drafts if kept is None else drafts[:kept]
        judged = accepted = 0
        while judged < len(verified):
            judged += 1
            if rng.random() >= acceptance(verified[judged - 1]):
                break
            accepted += 1
        cost = StepCost(len(verified) + 1, target(len(verified) + 1), len(drafts), draft * len(drafts))
        policy.update(judged, accepted, cost, tuple(verified))
        trace.append((k, len(verified)))
    return trace


def test_cheap_verifier_and_a_confident_assistant_draft_long():
    trace = simulate(Auto(5), 60, target=lambda n: 0.100, draft=0.005, confidence=lambda _: 0.9)
    assert trace[:3] == [(5, 5), (5, 5), (0, 0)]  # warm-up: prefill, a forward verifying drafts, one at k = 0
    verified = sorted(v for _, v in trace[4:])
    # a = 0.9 and flat costs: 13-15 drafts commit the most per second; the window (four times the last
    # accepted run) holds a step after an early rejection shorter
    assert verified[len(verified) // 2] >= 10 and 13 <= verified[-1] <= AutoConfig().k_max


def test_expensive_verifier_and_poor_acceptance_decode_plainly_and_probes_verify_nothing():
    trace = simulate(Auto(5), 60, target=lambda n: 0.01 + 0.1 * n, draft=0.02, confidence=lambda _: 0.2)
    late = trace[10:]
    assert [k for k, _ in late].count(0) >= 0.8 * len(late)
    assert all(v == 0 for _, v in late)  # a probe's unsure draft is cut before it costs a verification


def test_on_this_cpu_confident_runs_pay_and_unsure_ones_do_not():
    # fp32 Qwen2.5-Coder-0.5B drafts at 0.226 s a token, 0.6 of a 1.5B step: only long, sure runs pay
    sure = simulate(Auto(5), 40, target=cpu_target, draft=0.226, confidence=lambda _: 0.995)
    assert sum(v >= 10 for _, v in sure[4:]) >= 0.8 * len(sure[4:])  # a rare miss shortens the next window only
    unsure = simulate(Auto(5), 40, target=cpu_target, draft=0.226, confidence=lambda _: 0.7)
    assert [k for k, _ in unsure[4:]].count(0) >= 30 and all(v <= 1 for _, v in unsure[4:])


def test_when_acceptance_returns_the_probes_notice_and_drafting_resumes():
    def confidence(step):
        return 0.05 if step < 60 else 0.95

    trace = simulate(Auto(5), 120, target=lambda n: 0.1 + 0.02 * n, draft=0.01, confidence=confidence)
    assert [k for k, _ in trace[40:60]].count(0) >= 15  # poor acceptance: k = 0 with probes
    back = sorted(k for k, _ in trace[70:])  # after a probe, drafting pays again: every step drafts, mostly long
    assert back[0] >= 5 and back[len(back) // 2] >= 12


def test_probes_spend_at_most_the_budget_of_the_time_they_lose():
    cfg, policy = AutoConfig(), Auto(3)
    trace = simulate(policy, 200, target=lambda n: 0.1 + 0.001 * n, draft=0.05, confidence=lambda _: 0.0)
    probes = [i for i in range(6, len(trace)) if trace[i][0] > 0]
    gaps = {b - a for a, b in zip(probes, probes[1:])}
    # the budget: `probe_budget` of the plain time times the most drafting could save (every draft accepted)
    budget = cfg.probe_budget * upside(policy.state, cfg.k_max)
    assert 0 < budget < cfg.probe_budget
    assert all(v == 0 for _, v in trace[6:])  # every probe is cut at its first, unsure token ...
    assert len(probes) >= 4 and gaps == {math.ceil(0.05 / (budget * 0.101)) + 1}  # ... and loses 0.05 s

    policy = Auto(3)
    simulate(policy, 6, target=lambda n: 0.1, draft=0.05, confidence=lambda _: 0.0)
    policy.update(10, 0, StepCost(11, 0.1, 10, 0.5), (0.9,) * 10)  # a long draft failed at once: lost 0.5 s
    est = estimate(policy.state, cfg)
    # the next probe explores: at most `safe_drafts` (2 drafts, 0.2 s: one plain step lost if both fail), at the deficit
    assert safe_drafts(policy.state, cfg.k_max) == 2
    expected_loss = 0.2 * (1.0 - est.drafting_rate / est.plain_rate)
    budget = cfg.probe_budget * upside(policy.state, cfg.k_max)
    assert policy.k == 0 and _wait(policy.state, cfg) == math.ceil(expected_loss / (budget * 0.1))


def test_an_exploring_step_bets_more_after_its_drafts_were_accepted_slow_start():
    """An exploring step drafts at most what loses one plain step should the target accept no more of its drafts than
    of the row's last verified ones: a row whose drafts were all accepted about doubles its bet, so a good assistant
    that the costs make marginal at one draft (a draft costs over half a target step) reaches long drafts in a few
    steps; after a draft rejected at once it bets what could lose one plain step (`safe_drafts` at run 0)."""
    cfg = AutoConfig()
    costs = CostTable().with_target(1, 0.1, 0.9).with_target(21, 0.1, 0.9).with_draft(0.055, 0.9)
    state = AutoState(k0=5, costs=costs, prefilled=True, drafted_before=True)
    # k drafts cost 0.055 k + 0.1 s: at most one plain step (0.1 s) lost if the target accepts `run` of them
    assert [safe_drafts(state, cfg.k_max, run=run) for run in (0, 1, 3, 7)] == [1, 3, 7, 14]
    # the call's first steps explore: the window (k0, then four times the accepted run + 1), held to that bet
    assert choose(state, cfg) == 1
    state = observe(state, 1, 1, StepCost(2, 0.1, 1, 0.055), cfg, (0.9,))
    assert state.window == 8 and choose(state, cfg) == 3
    state = observe(state, 3, 0, StepCost(4, 0.1, 3, 0.165), cfg, (0.9,) * 3)  # rejected at once
    assert choose(state, cfg) <= 1


def test_one_unlucky_step_in_a_near_tie_does_not_lock_the_call_into_plain_decoding():
    cfg = AutoConfig()
    costs = CostTable().with_target(1, 0.1, 0.9).with_target(11, 0.1, 0.9).with_draft(0.05, 0.9)
    near_tie = AutoState(k0=3, costs=costs, drafting_tokens=9.5 * 5, drafting_seconds=1.0 * 5, drafting_steps=5,
                         prefilled=True, drafted_before=True)  # drafting: 9.5 tokens/s, plain decoding: 10
    state = observe(near_tie, 10, 0, StepCost(11, 0.1, 10, 0.5), cfg, (0.9,) * 10)  # 0.6 s for 1 token
    lost = 0.6 - 0.1  # what that step lost against plain decoding
    assert choose(state, cfg) == 0
    budget = cfg.probe_budget * upside(state, cfg.k_max)  # of the plain time, times the most drafting could save
    assert _wait(state, cfg) <= math.ceil(lost / (budget * 0.1)) / 4  # the next probe comes back soon


def test_the_cut_weighs_each_draft_against_what_verifying_it_costs():
    def beliefs(seconds, draft=0.01, acceptance=0.8, plain=None, lookup=0.8):
        return Estimates(tuple(seconds), draft, acceptance, Calibration(), plain or 1 / seconds[1], None, (lookup,) * 4)

    flat = beliefs([0.0] + [0.1] * 21)
    assert flat.cut((0.9, 0.9), 20) is None  # verification is free: draft on
    assert flat.cut((0.9,) * 20, 20) == 20  # at the cap: verify them all
    assert flat.cut((0.9, 0.9, 0.01), 20) == 3  # an unsure token ends the draft, but verifying it is free
    steep = beliefs([0.0] + [0.1 + 0.1 * n for n in range(1, 22)])
    assert steep.cut((0.9, 0.9, 0.01), 20) == 2  # ... and is dropped when each verified token costs a step
    assert steep.cut((0.05,), 20) == 0  # so is a lone unsure draft: the step decodes plainly
    assert steep.cut((float("nan"),), 1) == 1  # a prompt-lookup draft: lookup's own acceptance (0.8) decides
    assert beliefs(steep.target_seconds, lookup=0.3).cut((float("nan"),), 1) == 0


def test_where_a_few_tokens_verify_cheaper_than_one_even_unsure_drafts_are_verified():
    costs = CostTable()
    for n, seconds in [(1, 0.38), (2, 0.5), (4, 0.29), (6, 0.29), (8, 0.42)]:  # packed kernels on an AVX-512 EPYC
        costs = costs.with_target(n, seconds, 0.9)
    est = estimate(AutoState(k0=5, costs=costs.with_draft(0.057, 0.9)), AutoConfig())
    assert est.cut((0.1,), 20) is None  # verifying one unsure draft costs more than a step: draft into the dip
    assert est.cut((0.1,) * 3, 20) == 3  # three unsure drafts verify cheaper than a plain step


def test_a_second_is_priced_at_the_better_rate_so_fast_drafting_cuts_sooner():
    seconds = (0.0,) + tuple(0.1 + 0.005 * n for n in range(1, 22))  # cheap verification
    plain = Estimates(seconds, 0.005, 0.7, Calibration(), 1 / seconds[1], None)  # drafting rate not measured
    fast = replace(plain, drafting_rate=3 / seconds[1])  # drafting commits 3x plain decoding's tokens/s
    drafts = (0.7,) * 4
    assert plain.cut(drafts, 20) is None  # at plain decoding's price a fifth draft still saves time ...
    assert fast.cut(drafts, 20) == 4  # ... but the time would commit more in the next step
    slow = replace(plain, drafting_rate=0.5 / seconds[1])  # drafting measured slower: plain's price stands
    assert slow.cut(drafts, 20) == plain.cut(drafts, 20)


def test_calibration_learns_how_often_confident_drafts_are_accepted():
    cal = Calibration()
    assert cal.predict(np.array([0.9, 0.3]))[0] == pytest.approx(0.9)  # no evidence: the confidence itself
    for _ in range(40):
        cal = cal.observed((0.9, 0.9, 0.9, 0.9), 2, decay=0.95)  # overconfident: half of them accepted
    low, high = cal.predict(np.array([0.3, 0.9]))
    assert high == pytest.approx(0.5, abs=0.03) and low == pytest.approx(0.3)  # other bins keep their prior
    assert np.isnan(cal.predict(np.array([float("nan")]))[0])
    assert cal.observed((float("nan"),), 0, decay=0.5) == cal  # lookup drafts carry no confidence
    unlucky = Calibration().observed((1.0, 1.0, 1.0), 2, decay=0.95)  # a sure draft rejected early in a call
    assert unlucky.predict(np.array([1.0]))[0] == pytest.approx(0.75)
    assert unlucky.predict(np.array([1.0]), optimism=1.0)[0] > 0.9  # little evidence: read optimistically
    assert high < cal.predict(np.array([0.9]), optimism=1.0)[0] < high + 0.1  # much evidence: close to the mean


def test_the_cost_table_interpolates_measured_forwards_and_skips_both_prefills():
    cfg, state = AutoConfig(), AutoState(k0=4)
    for n, seconds in [(50, 9.0), (1, 0.4), (2, 0.8), (6, 1.2), (1, 0.4)]:  # the first forward is the prefill
        state = observe(state, 0, 0, StepCost(n, seconds, 0, 0.0), cfg)
    assert state.costs.measured() == (1, 2, 6)
    curve = estimate(state, cfg).target_seconds
    assert len(curve) == cfg.k_max + 2 and curve[0] == 0.0
    assert curve[1:3] == pytest.approx((0.4, 0.8)) and curve[4] == pytest.approx(1.0)  # between 2 and 6: a line
    assert curve[10] == pytest.approx(1.2)  # past 6: held until measured
    state = observe(state, 0, 0, StepCost(4, 0.3, 0, 0.0), cfg)  # cheaper than a step (a packed kernel's dip) ...
    curve = estimate(state, cfg).target_seconds
    assert curve[4] == pytest.approx(0.3) and curve[3] == pytest.approx(0.55)  # ... is kept, and bends its neighbours
    state = observe(state, 0, 0, StepCost(4, 1.1, 0, 0.0), cfg)  # timed again: the dip was noise
    assert estimate(state, cfg).target_seconds[4] == pytest.approx(0.3 + (1.1 - 0.3) / 1.9)  # decayed mean
    for seconds in [9.0, 0.02, 0.04]:  # the first drafting step holds the assistant's prefill
        state = observe(state, 2, 2, StepCost(3, 1.0, 2, 2 * seconds), cfg, (1.0, 1.0))  # sure, and right
    assert state.costs.draft_per_token == pytest.approx(0.9 * 0.02 + 0.1 * 0.04)
    # the two drafting steps after the assistant's prefill: 3 expected tokens in 1.04, 1.08 s
    est = estimate(state, cfg)
    assert est.plain_rate == pytest.approx(1 / 0.4) and est.drafting_rate == pytest.approx(5.4 / (0.8 * 1.04 + 1.08))


def test_a_calls_first_drafting_step_counts_at_the_seconds_the_remembered_costs_predict():
    cfg = AutoConfig()
    costs = CostTable().with_target(1, 0.42, 0.9).with_target(8, 0.55, 0.9).with_draft(0.06, 0.9)  # an earlier call's
    state = AutoState(k0=5, costs=costs)
    state = observe(state, 5, 5, StepCost(60, 6.0, 5, 1.5), cfg, (0.9,) * 5)  # both prefills: 7.5 s measured
    assert state.drafting_steps == 1
    assert state.drafting_seconds == pytest.approx(float(costs.curve(6)[6]) + 5 * 0.06)  # predicted, not 7.5 s
    for drafted, accepted in [(7, 1), (5, 0)]:  # then two unlucky steps (the essay prompt on the Xeon)
        state = observe(state, drafted, accepted, StepCost(drafted + 1, 0.5, drafted, drafted * 0.06), cfg,
                        (0.9,) * drafted)
    assert choose(state, cfg) > 0  # three steps of evidence: drafting still pays
    unlucky_start = AutoState(k0=5, costs=costs)
    for drafted, accepted, seconds in [(5, 0, 6.0), (7, 1, 0.5), (5, 0, 0.5)]:
        unlucky_start = observe(unlucky_start, drafted, accepted, StepCost(drafted + 1, seconds, drafted,
                                                                          drafted * 0.06), cfg, (0.9,) * drafted)
    assert choose(unlucky_start, cfg) == 0  # three unlucky steps: plain decoding


def test_the_assistants_first_call_is_timed_per_position_it_caught_up_on():
    cfg = AutoConfig()
    costs = CostTable().with_target(1, 0.4, 0.9).with_target(6, 0.6, 0.9)
    state = AutoState(k0=5, costs=costs, prefilled=True, lag=100)  # the assistant lacks the 100-token prompt
    state = observe(state, 3, 3, StepCost(4, 0.5, 3, 2.06), cfg, (0.9,) * 3)
    assert state.costs.catch_up == pytest.approx(2.06 / 103) and state.costs.draft_per_token is None
    state = observe(replace(state, lag=200), 3, 3, StepCost(4, 0.5, 3, 0.3), cfg, (0.9,) * 3)
    assert state.costs.catch_up == pytest.approx(2.06 / 103)  # only a call's first assistant call is its catch-up
    short = observe(AutoState(k0=5, costs=costs, lag=cfg.catch_up_min - 1), 3, 3, StepCost(4, 0.5, 3, 0.3), cfg)
    assert short.costs.catch_up is None  # a few positions: a drafting round, not a prefill


def test_a_row_decodes_plainly_until_its_plain_steps_lost_what_the_assistants_catch_up_costs():
    cfg = AutoConfig()
    costs = replace(CostTable().with_target(1, 0.4, 0.9).with_target(6, 0.6, 0.9).with_draft(0.1, 0.9),
                    catch_up=0.01, drafting_rate=4.0)  # drafting: 4 tokens a second against plain decoding's 2.5
    policy = Auto(5, costs=costs)
    assert policy.k == 5  # nothing to catch up on
    policy.assistant_behind(100)  # the prompt: 1 s of catch-up; a plain step loses 0.4 s * (1 - 2.5 / 4) = 0.15 s
    ks = []
    for _ in range(8):
        ks.append(policy.k)
        policy.update(0, 0, StepCost(1, 0.4, 0, 0.0))
        policy.assistant_behind(policy.state.lag + 1)
    assert ks == [0] * 8 and policy.k == 5  # 8 x 0.15 s >= 1.08 s of catch-up (7 x 0.15 s < 1.07 s)
    assert policy.state.rent == pytest.approx(8 * 0.15)
    unknown = Auto(5, costs=replace(costs, drafting_rate=None))  # no rate: a plain step loses all of its seconds
    unknown.assistant_behind(100)
    for _ in range(3):
        unknown.update(0, 0, StepCost(1, 0.4, 0, 0.0))
    # no rate known: it drafts, its first bets at most what could lose one plain step (`safe_drafts`: 2 of 0.1 s here)
    assert unknown.k == safe_drafts(unknown.state, cfg.k_max) == 2 and unknown.state.rent == pytest.approx(1.2)
    slow = Auto(5, costs=replace(costs, drafting_rate=2.0))  # drafting slower than plain: probes' budget only
    slow.assistant_behind(100)
    slow.update(0, 0, StepCost(1, 0.4, 0, 0.0))
    assert slow.k == 0 and slow.state.rent == pytest.approx(0.4 * cfg.probe_budget)


def test_a_call_hands_its_drafting_rate_to_the_next_call_on_the_pair():
    costs = CostTable().with_target(1, 0.4, 0.9).with_target(6, 0.6, 0.9).with_draft(0.1, 0.9)
    policy = Auto(5, costs=costs)
    assert policy.learned().drafting_rate is None  # no drafting step timed yet
    policy.update(0, 0, StepCost(1, 0.4, 0, 0.0))  # the prefill
    policy.update(5, 5, StepCost(6, 0.6, 5, 0.5), (0.99,) * 5)
    state = policy.state
    assert state.drafting_steps == 1
    assert policy.learned().drafting_rate == pytest.approx(state.drafting_tokens / state.drafting_seconds)
    again = Auto(5, costs=replace(policy.learned(), drafting_rate=10.0))
    again.update(0, 0, StepCost(1, 0.4, 0, 0.0))
    again.update(5, 5, StepCost(6, 0.6, 5, 0.5), (0.99,) * 5)
    rate = again.state.drafting_tokens / again.state.drafting_seconds
    assert again.learned().drafting_rate == pytest.approx(0.8 * 10.0 + 0.2 * rate)  # decayed like the call's rate


def test_acceptance_is_a_decayed_rate_with_a_prior_kept_apart_for_prompt_lookup():
    cfg, state = AutoConfig(), AutoState(k0=4)
    nan = float("nan")
    for _ in range(30):
        state = observe(state, 4, 1, None, cfg, (0.9, 0.9, 0.9, 0.9))
        state = observe(state, 3, 3, None, cfg, (nan, nan, nan))  # lookup drafts: all accepted
    weight = sum(cfg.acceptance_decay**i for i in range(30))  # 1 of 4 accepted per step, plus the prior
    prior = cfg.acceptance_prior * cfg.prior_weight
    est = estimate(state, cfg)
    assert est.acceptance == pytest.approx((weight + prior) / (4 * weight + cfg.prior_weight))
    places = (weight + prior) / (weight + cfg.prior_weight)  # one judged copy token per place of RUN_BINS[:3] a step
    assert est.lookup_acceptance == pytest.approx((places, places, places, cfg.acceptance_prior))


def test_a_copy_is_predicted_by_the_place_of_each_token_in_its_run():
    cfg, state = AutoConfig(), AutoState(k0=4)
    nan = float("nan")
    for _ in range(30):  # copies whose first token is often wrong and whose later tokens hold
        state = observe(state, 1, 0, None, cfg, (nan,))  # judged up to the first rejection
        state = observe(state, 5, 5, None, cfg, (nan,) * 5)
    first, second, third, later = estimate(state, cfg).lookup_acceptance
    d, prior = cfg.acceptance_decay, cfg.acceptance_prior * cfg.prior_weight  # the accepted copies came last
    judged, accepted = sum(d**i for i in range(60)), sum(d ** (2 * i) for i in range(30))
    assert first == pytest.approx((accepted + prior) / (judged + cfg.prior_weight))
    weight = sum(d**i for i in range(30))  # later places: only the accepted copies reach them, places 2-3 twice
    assert second == later == pytest.approx((weight + prior) / (weight + cfg.prior_weight))
    assert third == pytest.approx((2 * weight + prior) / (2 * weight + cfg.prior_weight))
    accepts = estimate(state, cfg).accepts((0.99, nan, nan, nan, 0.99, nan))  # a model draft starts a new run
    assert accepts[1] == pytest.approx(first) and accepts[2] == pytest.approx(second)
    assert accepts[3] == pytest.approx(third) and accepts[5] == pytest.approx(first)


def test_auto_warms_up_at_the_starting_k_and_is_a_pure_function_of_its_state():
    cfg = AutoConfig()
    assert choose(AutoState(k0=3), cfg) == 3
    policy = Auto(3)
    for step in range(3):
        assert policy.k == (0 if step == 2 else 3) and policy.cut((0.01,)) is None  # no cut in the warm-up
        k = policy.k
        policy.update(k, k, StepCost(k + 1, 0.05, k, 0.0001 * k), (0.99,) * k)
    assert choose(policy.state, cfg) == policy.k == 16  # near-free drafts, all 3 accepted: the window is 4 * (3 + 1)


def test_costs_a_call_measured_replace_the_warm_up_of_the_next():
    first = Auto(5)
    simulate(first, 30, target=lambda n: 0.4 * n, draft=0.2, confidence=lambda _: 0.3)
    costs = first.learned()
    assert costs.measured() and costs.draft_per_token == pytest.approx(0.2)
    second = Auto(5, costs=costs)
    assert second.k == 5 and second.cut((0.3,)) == 0  # drafts (window k0) to measure its rate, cut at once
    cheap = Auto(5)
    simulate(cheap, 30, target=lambda n: 0.1, draft=0.001, confidence=lambda _: 0.95)
    trace = simulate(Auto(5, costs=cheap.learned()), 3, target=lambda n: 0.1, draft=0.001, confidence=lambda _: 1.0)
    assert trace == [(5, 5), (20, 20), (20, 20)]  # no warm-up, no step at k = 0; the window starts at k0, then
    # grows to four times the accepted run (at most k_max)
    assert isinstance(make_policy("auto", 5, costs), Auto)


def test_an_early_confident_miss_does_not_stop_drafting_for_the_rest_of_the_call():
    # int8 Qwen2.5-Coder-0.5B drafts at 0.07 s a token; the target accepts 97% of its sure drafts. An unlucky
    # early rejection must not make the cut drop every later draft unverified: it would never learn otherwise.
    def run(policy, seed):
        return simulate(policy, 40, cpu_target, 0.07, confidence=lambda _: 0.995, acceptance=lambda c: 0.97, seed=seed)

    earlier = Auto(5)  # an earlier call measured the costs: this call starts drafting at once, with no evidence
    run(earlier, seed=99)
    stuck = []
    for seed in range(20):
        trace = run(Auto(5, costs=earlier.learned()), seed)
        stuck += [seed] if sum(v for _, v in trace[20:]) < 20 else []
    assert not stuck


def test_a_step_whose_cut_verified_nothing_keeps_the_window():
    costs = CostTable().with_target(1, 0.1, 0.9).with_target(8, 0.2, 0.9).with_draft(0.01, 0.9)
    policy = Auto(5, costs=costs)
    policy.update(6, 6, StepCost(7, 0.2, 6, 0.06), (0.99,) * 6)
    assert policy.state.window == 28
    policy.update(0, 0, StepCost(1, 0.1, 1, 0.01), ())  # one unsure draft, dropped unverified
    assert policy.state.window == 28
    policy.update(3, 1, StepCost(4, 0.15, 3, 0.03), (0.99,) * 3)  # judged: rejected at the second draft
    assert policy.state.window == 8


def test_a_row_without_an_assistant_grows_its_window_from_the_copies_the_target_accepted():
    """Prompt-lookup copies alone (no assistant call): a step whose copies were all accepted widens the cut's cap like
    an assistant's run (it stayed at k0 all call: at 95% acceptance the cut verified 5 copies where 8 paid)."""
    costs = CostTable().with_target(1, 0.1, 0.9).with_target(8, 0.2, 0.9)
    policy = Auto(5, costs=costs)
    policy.update(5, 5, StepCost(6, 0.15, 0, 0.0), (math.nan,) * 5)
    assert policy.state.window == 24 and policy.estimates().cap(20) == 20
    policy.update(4, 1, StepCost(5, 0.15, 0, 0.0), (math.nan,) * 4)  # rejected at the second copy
    assert policy.state.window == 8


def test_a_table_that_never_timed_the_plain_forward_prices_it_on_the_line_through_the_two_narrowest():
    """In a batch every forward is wider than its rows (forced tokens and copies are positions too), so the plain
    forward of 16 rows may never run; the cost table then prices it from the two narrowest forwards timed, and the
    cut weighs prompt-lookup copies from the first such pair of timings on (before: never, every copy verified)."""
    costs = CostTable().with_target(20, 0.30, 1.0)
    assert not costs.knows(16) and costs.curve(1, 16)[1] == pytest.approx(0.30)  # one timing: held flat
    costs = costs.with_target(90, 1.18, 1.0, 64 * 16)
    assert costs.knows(16) and not costs.knows(95) and costs.knows(90)
    slope = (1.18 - 0.30) / 70
    assert costs.curve(1, 16)[1] == pytest.approx(0.30 - 4 * slope)  # on the line below the narrowest
    assert costs.curve(1, 1)[1] == pytest.approx(max(0.30 - 19 * slope, 0.0))
    assert CostTable().with_target(4, 0.5, 1.0).with_target(8, 0.4, 1.0).curve(2, 1)[1:] == pytest.approx((0.5, 0.5))
    cfg, nan = AutoConfig(), float("nan")
    state = AutoState(k0=0, costs=costs, prefilled=True, drafted_before=True)
    one_timing = CostTable().with_target(90, 1.18, 1.0, 64 * 16)
    assert warmed_up(state, 16) and not warmed_up(replace(state, costs=one_timing), 16)
    failing = state
    for _ in range(6):
        failing = observe(failing, 3, 0, None, cfg, (nan,) * 3)
    assert estimate(failing, cfg, 16).cut((nan,) * 3, cfg.k_max) == 0  # copies the target rejects: none verified


def test_auto_stops_verifying_prompt_copies_that_the_target_keeps_rejecting():
    cfg, nan = AutoConfig(), float("nan")
    costs = CostTable().with_target(1, 0.10, 1.0).with_target(4, 0.16, 1.0).with_draft(0.03, 1.0)
    state = AutoState(k0=4, costs=costs, prefilled=True, drafted_before=True)
    copies = (nan, nan, nan)  # three prompt-lookup drafts: they carry no confidence
    assert estimate(state, cfg).cut(copies, cfg.k_max) == 3  # the prior: copies are worth verifying
    failing, passing = state, state
    for _ in range(6):
        failing = observe(failing, 3, 0, None, cfg, copies)
        passing = observe(passing, 3, 3, None, cfg, copies)
    assert estimate(failing, cfg).cut(copies, cfg.k_max) == 0  # measured to fail: none verified
    assert estimate(passing, cfg).cut(copies, cfg.k_max) is None  # measured to pass: copy on, all kept


# --- pricing a draft tree's side leaf ------------------------------------------------------------------------
# The leaf commits one more token where the chain reaches its sibling, the sibling is rejected and the target
# picks the runner-up: reach * (1 - acceptance(sibling)) * acceptance(runner-up), against one more row's seconds.

CHEAP_ROW = (0.0,) + tuple(0.1 + 0.001 * n for n in range(1, 22))  # a row: 0.001 s at 9.9 tokens/s, 0.01 tokens
DEAR_ROW = (0.0,) + tuple(0.1 + 0.2 * n for n in range(1, 22))  # a row: 0.2 s at 3.3 tokens/s, 0.67 tokens


def leaf_beliefs(seconds: tuple[float, ...]) -> Estimates:
    """Beliefs without evidence: each acceptance reads as the assistant's confidence."""
    return Estimates(seconds, 0.01, 0.7, Calibration(), 1 / seconds[1], None)


def test_a_leaf_is_verified_where_a_row_is_cheap_and_the_runner_up_likely():
    sure_chain, unsure_sibling, likely = (0.95, 0.95), 0.3, 0.9  # 0.9025 * 0.7 * 0.9 = 0.57 expected tokens
    assert leaf_beliefs(CHEAP_ROW).leaf_pays(sure_chain, unsure_sibling, likely, rows=3)
    assert not leaf_beliefs(DEAR_ROW).leaf_pays(sure_chain, unsure_sibling, likely, rows=3)  # 0.67 > 0.57
    assert not leaf_beliefs(CHEAP_ROW).leaf_pays(sure_chain, unsure_sibling, 0.01, rows=3)  # runner-up unlikely
    assert not leaf_beliefs(CHEAP_ROW).leaf_pays(sure_chain, 0.99, likely, rows=3)  # sibling seldom rejected
    assert not leaf_beliefs(CHEAP_ROW).leaf_pays((0.1, 0.1), unsure_sibling, likely, rows=3)  # seldom reached
    assert leaf_beliefs(DEAR_ROW).leaf_pays(sure_chain, unsure_sibling, likely, rows=21)  # past the curve: free
    fast = replace(leaf_beliefs(CHEAP_ROW), drafting_rate=1000.0)  # the cut's price: drafting commits 1000 tokens/s
    assert not fast.leaf_pays(sure_chain, unsure_sibling, likely, rows=3)  # so a 1 ms row is worth a token


def test_auto_prices_a_leaf_from_its_draft_and_the_fixed_schedules_always_verify_it():
    import torch

    from drafting.tree import Branch

    nan = float("nan")
    cheap = CostTable().with_target(1, 0.1, 0.9).with_target(8, 0.107, 0.9).with_draft(0.01, 0.9)  # 1 ms a row
    dear = CostTable().with_target(1, 0.1, 0.9).with_target(8, 1.5, 0.9).with_draft(0.01, 0.9)  # 0.2 s a row
    draft = Draft((5, 6, 7), ("assistant", "forced", "assistant"), None, None, (0.95, nan, 0.3), False)
    leaf = Branch(2, 8, None, True, 0.9)  # the alternative to the second assistant token; the forced one is free
    assert Auto(5, costs=cheap).leaf_pays(draft, leaf, rows=4)  # 0.95 * 0.7 * 0.9 = 0.6 tokens against 0.01
    assert not Auto(5, costs=dear).leaf_pays(draft, leaf, rows=4)  # ... against 2 tokens
    no_bonus = replace(leaf, bonus=False)  # the leaf ends in EOS or a coalesced forced run
    assert not Auto(5, costs=cheap).leaf_pays(draft, no_bonus, rows=4)  # greedy: it commits nothing more
    sampled = replace(draft, q=torch.zeros(3, 8))  # sampling: whether a leaf is verified must not depend on it
    assert Auto(5, costs=cheap).leaf_pays(sampled, no_bonus, rows=4)
    for fixed in (Constant(5), Heuristic(5)):
        assert fixed.leaf_pays(draft, no_bonus, rows=4)


def test_the_runner_ups_acceptance_is_calibrated_online_like_the_chains():
    cfg = AutoConfig()
    costs = CostTable().with_target(1, 0.1, 0.9).with_target(8, 0.17, 0.9).with_draft(0.01, 0.9)  # a row: 0.1 tokens
    state = AutoState(k0=5, costs=costs)
    likely, unlikely = ((0.95,), 0.3, 0.6, 3), ((0.95,), 0.3, 0.1, 3)  # prior: 0.4 and 0.07 expected tokens
    assert estimate(state, cfg).leaf_pays(*likely) and not estimate(state, cfg).leaf_pays(*unlikely)
    missed, picked = state, state
    for _ in range(20):
        missed = observe_leaf(missed, 0.6, False, cfg)  # the target never picks these runner-ups ...
        picked = observe_leaf(picked, 0.1, True, cfg)  # ... and always picks these
    assert not estimate(missed, cfg).leaf_pays(*likely)
    assert estimate(picked, cfg).leaf_pays(*unlikely)
    assert missed.calibration == picked.calibration == state.calibration  # the chain's calibration is apart


def test_worth_checks_the_estimates_against_the_verdicts_and_leaves_luck_alone():
    """Point masses from another tokenizer: the assistant is sure (0.9-0.995, a different confidence bin each step) and
    the target rejects them. `worth` (accepted over predicted, past two standard deviations of luck) scales every
    estimate down where the calibration of each bin alone would not have learned yet (control: `worth` off); a
    calibrated source's one miss in a long run leaves it at 1."""
    costs = CostTable().with_target(1, 0.1, 0.9).with_target(4, 0.15, 0.9).with_draft(0.01, 0.9)
    checked, unchecked = Auto(3, AutoConfig(), costs=costs), Auto(3, AutoConfig(worth_weight=1e9), costs=costs)
    for policy in (checked, unchecked):
        for c in (0.9, 0.96, 0.995):
            policy.update(1, 0, StepCost(4, 0.15, 3, 0.03), (c,) * 3)
    assert checked.estimates().worth < 0.9 and unchecked.estimates().worth == pytest.approx(1.0)
    assert checked.estimates().accepts((0.995,))[0] < 0.9 * unchecked.estimates().accepts((0.995,))[0]

    calibrated = Auto(3, AutoConfig(), costs=costs)
    for step in range(8):
        calibrated.update(3, 3 - (step == 6), StepCost(4, 0.15, 3, 0.03), (0.97,) * 3)
    assert calibrated.estimates().worth == 1.0

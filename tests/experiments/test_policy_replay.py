"""The policy replay (experiments.policy_replay): its model of a decoding step, without models."""

import random

import pytest

from experiments import policy_replay as pr
from experiments.policy_replay import (ConfidenceStop, Costs, Trace, calibrated, make_policies, planned, replay,
                                       replay_all, report, summarize)
from assisted.policy.draft_policy import Constant, Heuristic

COSTS = Costs(target=(0.0,) + tuple(0.1 + 0.01 * n for n in range(1, 23)), draft=0.02)


def trace(acceptance, confidence=None, temperature=0.0):
    confidence = confidence or [0.9] * len(acceptance)
    return Trace("code", "p", temperature, 0, tuple(acceptance), tuple(confidence))


def test_plain_decoding_pays_one_single_token_forward_per_token():
    tokens, seconds, forwards = replay(Constant(0), trace([1.0] * 12), COSTS, [0.5] * 12, sampling=False)
    assert (tokens, forwards) == (12, 12)
    assert abs(seconds - 12 * COSTS.target[1]) < 1e-9


def test_accepted_drafts_commit_k_plus_one_tokens_per_forward_at_the_costs_of_the_table():
    tokens, seconds, forwards = replay(Constant(3), trace([1.0] * 12), COSTS, [0.5] * 12, sampling=False)
    assert (tokens, forwards) == (12, 3)  # 4 + 4 + 4
    assert abs(seconds - 3 * (COSTS.target[4] + 3 * COSTS.draft)) < 1e-9


def test_a_rejected_position_ends_the_step_and_the_target_writes_that_token():
    acceptance = [1.0, 0.0] + [1.0] * 8  # position 1 is always rejected
    _, _, forwards = replay(Constant(3), trace(acceptance), COSTS, [0.5] * 10, sampling=False)
    assert forwards == 3  # positions 0-1 (1 rejected, the target writes it), 2-5 and 6-9 (3 drafts + bonus)
    rejected = replay(Heuristic(3), trace([0.0] * 10), COSTS, [0.5] * 10, sampling=False)
    assert rejected[2] == 10


def test_the_same_uniforms_give_every_policy_the_same_luck_at_each_position():
    acceptance = [0.5] * 30
    draws = random.Random(1)
    uniforms = [draws.random() for _ in range(30)]
    lucky = [u < 0.5 for u in uniforms]
    _, _, forwards = replay(Constant(1), trace(acceptance, temperature=0.6), COSTS, uniforms, sampling=True)
    # k = 1 from every position: a step commits 2 tokens exactly when its position is lucky
    pos, expected = 0, 0
    while pos < 30:
        pos, expected = pos + (2 if pos < 29 and lucky[pos] else 1), expected + 1
    assert forwards == expected


def test_confidence_stop_ends_a_draft_after_an_unsure_token():
    policy = ConfidenceStop(Constant(20))
    assert policy.cut((0.9, 0.9)) is None
    assert policy.cut((0.9, 0.3)) == 2  # the unsure token is still verified, as in transformers
    assert policy.k == 20


def test_a_sampled_replay_lets_a_cut_drop_only_the_last_draft():
    class CutToZero(Constant):
        def cut(self, confidence):
            return 0 if len(confidence) == 3 else None

    # 4 positions: three drafts cut to 2 verified (+ the bonus), then the last position plainly
    _, seconds, forwards = replay(CutToZero(5), trace([1.0] * 4, temperature=1.0), COSTS, [0.5] * 4, sampling=True)
    assert forwards == 2 and abs(seconds - (COSTS.target[3] + 3 * COSTS.draft + COSTS.target[1])) < 1e-9
    # greedy: all three dropped (the target writes position 0), then two drafts and the bonus
    _, seconds, _ = replay(CutToZero(5), trace([1.0] * 4), COSTS, [0.5] * 4, sampling=False)
    assert abs(seconds - (COSTS.target[1] + 3 * COSTS.draft + COSTS.target[3] + 2 * COSTS.draft)) < 1e-9


def test_the_bound_drafts_exactly_as_far_as_it_pays_when_it_knows_the_acceptance():
    assert abs(planned(trace([1.0] * 4), COSTS) - (COSTS.target[4] + 3 * COSTS.draft)) < 1e-12  # one step of 3 drafts
    assert abs(planned(trace([0.0] * 5), COSTS) - 5 * COSTS.target[1]) < 1e-12  # nothing accepted: plain decoding
    # sampling at a fixed chance a: one draft per step is worth it here, and the bound's recursion agrees
    a, one = 0.5, COSTS.target[2] + COSTS.draft  # 2 positions: draft 1 (commit 2 w.p. a, else 1 + a plain step)
    expected = min(2 * COSTS.target[1], one + (1 - a) * COSTS.target[1])
    assert abs(planned(trace([a, a], temperature=0.6), COSTS) - expected) < 1e-12


def test_a_plan_from_a_wrong_belief_costs_more_than_the_bound():
    acceptance = [1.0] * 6 + [0.0] + [1.0] * 6
    limit = planned(trace(acceptance), COSTS)
    assert abs(planned(trace(acceptance), COSTS, belief=[0.0] * 13) - 13 * COSTS.target[1]) < 1e-12  # plain decoding
    assert limit < planned(trace(acceptance), COSTS, belief=[1.0] * 13) < 13 * COSTS.target[1]


def test_the_calibrated_belief_is_the_mean_acceptance_of_each_confidence_bin_at_the_same_temperature():
    traces = [trace([1.0, 0.0, 1.0], [0.99, 0.2, 0.999]), trace([0.5, 0.25], [0.2, 0.2]),
              trace([0.3], [0.2], temperature=0.6)]
    beliefs = calibrated(traces)
    assert [b.tolist() for b in beliefs] == [[1.0, 0.25, 1.0], [0.25, 0.25], [0.3]]  # (0 + 0.5 + 0.25) / 3


def test_no_greedy_policy_beats_the_bound():
    draws = random.Random(7)
    for _ in range(5):
        acceptance = [float(draws.random() < 0.8) for _ in range(40)]
        confidence = [draws.random() for _ in range(40)]
        limit = planned(trace(acceptance, confidence), COSTS)
        assert limit <= planned(trace(acceptance, confidence), COSTS, belief=[0.8] * 40) + 1e-12
        for name, make in make_policies(COSTS).items():
            _, seconds, _ = replay(make(trace(acceptance, confidence)), trace(acceptance, confidence), COSTS,
                                   [0.5] * 40, sampling=False)
            assert limit <= seconds + 1e-12, name


def test_report_compares_auto_with_the_best_other_policy_per_cell():
    traces = [trace([1.0] * 30), trace([0.7] * 30, temperature=0.6)]
    policies = make_policies(COSTS)
    rows = replay_all(traces, COSTS, policies, seeds=3, overhead=0.0, noise=0.0)
    summary = summarize(rows)
    assert summary[("code", 0.0, "heuristic")] < summary[("code", 0.0, "plain")]  # all drafts accepted: drafting pays
    lines = report(summary, list(policies))
    assert len(lines) == 4 and lines[2].startswith("| code | 0.0 |")
    greedy = pr.headroom({key: v for key, v in summary.items() if key[1] == 0.0})  # sampled draws can beat it
    assert [line.split(" | ")[0] for line in greedy[2:]] == ["| constant-20", "| heuristic-5"]
    bound_over = [float(line.split(" | ")[3].split()[0]) for line in greedy[2:]]
    assert all(b >= 1.0 for b in bound_over)  # no greedy stand-in beats the bound
    assert all(summary[("code", 0.0, "bound")] <= summary[("code", 0.0, p)] + 1e-12 for p in policies)


def test_auto_replays_start_from_the_calibration_of_the_latest_call_on_another_prompt_at_the_same_temperature():
    remembering = make_policies(COSTS)["auto"]
    story = Trace("prose", "story", 0.6, 0, (1.0,) * 30, (0.9,) * 30)
    first = remembering(story)
    replay(first, story, COSTS, [0.5] * 30, sampling=True)
    assert sum(first.calibration().judged) > 0
    again = remembering(story)
    assert sum(again.calibration().judged) == 0  # the same text: nothing carried
    replay(again, story, COSTS, [0.5] * 30, sampling=True)
    essay = Trace("prose", "essay", 0.6, 0, (1.0,) * 30, (0.9,) * 30)
    assert remembering(essay).calibration() == again.calibration()  # the latest call on another prompt
    assert sum(remembering(trace([1.0] * 30)).calibration().judged) == 0  # greedy: nothing learned yet


def test_a_multi_model_cost_table_gives_the_target_curve_and_the_assistant_token_it_is_asked_for(tmp_path):
    path = tmp_path / "costs.csv"
    rows = ["model,dtype,context,layout,n,repeat,seconds"]
    rows += [f"big,bf16,{c},dense,{n},{r},{c / 100 + n / 1000 + r / 1e6}" for c in (200, 1000) for n in (1, 2, 4)
             for r in (1, 2, 3)]
    rows += [f"small,bf16,200,dense,1,{r},{0.003 + r / 1e6}" for r in (1, 2, 3)]
    path.write_text("\n".join(rows) + "\n")
    costs = pr.costs_from_timings(path, "dense", 9.0, 5, {"model": "big", "context": "1000"}, {"model": "small"})
    assert costs.draft == pytest.approx(0.003002)
    assert costs.target[1] == pytest.approx(10.001002) and costs.target[4] == pytest.approx(10.004002)
    assert costs.target[5] == pytest.approx(10.005002)  # past the largest n: the last slope
    with pytest.raises(ValueError, match="no column 'gpu'"):
        pr.costs_from_timings(path, "dense", 9.0, 5, {"gpu": "h100"})
    with pytest.raises(ValueError, match="no n = 1 timing"):
        pr.costs_from_timings(path, "dense", 9.0, 5, {"model": "big"}, {"model": "missing"})


def test_fixed_schedules_draft_k_tokens_every_step():
    policies = pr.make_policies(pr.Costs((0.0,) + (1.0,) * 22, 0.1), fixed=(3,))
    trace = pr.Trace("code", "p", 0.0, 0, (1.0,) * 12, (0.9,) * 12)
    tokens, _, forwards = pr.replay(policies["fixed-3"](trace), trace, pr.Costs((0.0,) + (1.0,) * 22, 0.1),
                                    [0.0] * 12, sampling=False)
    assert (tokens, forwards) == (12, 3)  # 4 tokens a step; the last step drafts only what is left (3)



def test_collected_costs_come_from_the_one_forward_cost_timer(smol_tokenizer):
    from tests.helpers_models import threads, tiny_llama

    model = tiny_llama(len(smol_tokenizer), seed=0)
    ids = smol_tokenizer("def fibonacci(n): return n").input_ids
    with threads(1):
        costs = pr.time_costs(model, tiny_llama(len(smol_tokenizer), seed=1), ids, n_max=4, repeats=1)
    assert len(costs.target) == 5 and costs.target[0] == 0.0 and all(s > 0 for s in costs.target[1:])
    assert costs.draft > 0


# --- the grid (experiments.policy_grid): auto against plain decoding and every fixed draft length ---------------

from experiments import policy_grid as pg  # noqa: E402
from experiments.policy_grid import Cell  # noqa: E402

# Cells where `auto` lost (< 0.97x the better of plain decoding and the best fixed k) before issue 60: the foreign
# assistant's case (point masses the assistant is sure of, a verify of 3.4 positions at 2x a step), poor acceptance
# on the int8 CPU target alone and in a batch, and cheap drafts that a short fixed draft uses better.
LOSING = [
    Cell(0.3, 0.7, 0.2, 1, "point-mass", "steep"),  # issue 56's probe: acceptance 0.28 at T = 0.7, was 0.950x
    Cell(0.1, 0.0, 0.5, 1, "point-mass", "steep"),  # was 0.947x
    Cell(0.5, 1.5, 0.5, 1, "point-mass", "steep"),  # was 0.944x
    Cell(0.1, 1.5, 1.0, 1, "assistant", "int8"),  # was 0.963x
    Cell(0.1, 0.7, 0.5, 4, "point-mass", "int8"),  # was 0.943x
]


# Still short after issue 60 (0.94-0.96x): what `auto` loses there is its start (two drafting steps) and its probes
# (3% of the plain time by `probe_budget`), not a wrong estimate. Short probes at a 1% budget reach 0.969-0.982x on
# these cells but stop a call whose first long draft met an early miss from drafting again within 40 steps
# (tests/assisted/test_policy.py::test_an_early_confident_miss_...): strict, so a fix shows here.
STILL_SHORT = pytest.mark.xfail(strict=True, reason="issue 60: start and probe cost exceed 3% on 160-token calls")


@pytest.mark.parametrize("cell", [pytest.param(c, marks=STILL_SHORT) for c in LOSING], ids=str)
def test_auto_reaches_097_of_the_better_of_plain_and_the_best_fixed_k_where_it_lost(cell):
    score = pg.score(cell)
    assert score.ratio >= 0.97, (score.auto, score.plain, score.fixed)


@pytest.mark.parametrize("cell", [Cell(0.95, 0.0, 0.05, 1), Cell(0.7, 0.7, 0.2, 1), Cell(0.3, 0.0, 0.05, 1, "lookup"),
                                  Cell(0.85, 0.7, 0.05, 1, "point-mass"), Cell(0.1, 0.0, 0.05, 4)], ids=str)
def test_auto_keeps_up_where_it_already_did(cell):
    assert pg.score(cell).ratio >= 0.97


def test_the_grid_can_fail_a_schedule_that_drafts_where_plain_decoding_wins():
    """Negative control: a policy that always drafts 4 scores as `auto` would, and falls below 0.97x where drafts are
    rarely accepted and a verify is dear."""
    cell = LOSING[0]
    rows, clk = pg.traces(cell), pg.clock(cell)
    always = pg.replay([Constant(4)], rows, clk, cell, 160)
    assert always / pg.score(cell).plain < 0.97


@pytest.mark.parametrize("k", [0, 3])
def test_the_short_replay_of_a_fixed_k_is_the_engine_replay_of_it(k):
    for cell in (Cell(0.5, 0.7, 0.2, 4), Cell(0.7, 0.0, 0.5, 1, "lookup")):
        rows, clk = pg.traces(cell), pg.clock(cell)
        slow = pg.replay([Constant(k) for _ in rows], rows, clk, cell, 40)
        assert slow == pytest.approx(pg.fixed_rate(k, rows, clk, cell, 40), rel=1e-12)


def test_greedy_cells_accept_a_position_the_same_for_every_policy_and_sampled_ones_draw_it():
    greedy, sampled = pg.traces(Cell(0.5, 0.0, 0.2, 2))[0], pg.traces(Cell(0.5, 0.7, 0.2, 2))[0]
    assert set(greedy.chance) <= {0.0, 1.0} and 0.3 < sum(greedy.chance) / len(greedy.chance) < 0.7
    assert 0.4 < sum(sampled.chance) / len(sampled.chance) < 0.6 and len(set(sampled.uniform)) == len(sampled.uniform)
    sure = pg.traces(Cell(0.1, 0.7, 0.2, 1, "point-mass"))[0]
    assert min(sure.confidence) >= 0.9  # another tokenizer's text: the assistant is sure whatever the target thinks


def test_prompt_lookup_rows_in_a_batch_do_not_draft_on_for_rows_that_have_not_filled_yet():
    """Prompt-lookup copies fill row by row, all at once: a row's cut must not count the later rows' copies as a reason
    to go on (it did: every row then verified 7-20 copies and the batch ran at 0.5x plain decoding)."""
    score = pg.score(Cell(0.5, 1.5, 0.5, 4, "lookup"))
    assert score.auto > score.plain

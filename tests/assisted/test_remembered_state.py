"""What `schedule="auto"` remembers per model pair: cleared before every test, reset by a public call, and
safe under concurrent `generate` calls from several threads."""

from __future__ import annotations

import sys
from dataclasses import replace
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import assisted
from assisted import generate
from assisted.policy.costs import CostTable, memorize, recall, recall_calibration
from drafting.sampling import Warp
from tests.helpers_models import smollm2_tokenizer, threads, tiny_gpt2

pytestmark = [pytest.mark.usefixtures("one_thread")]

V = 49152
GREEDY = Warp()


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def pair():
    return tiny_gpt2(V, seed=2), tiny_gpt2(V, seed=3)


def run_auto(tok, target, assistant, max_new_tokens=10):
    return generate(target, assistant, tokenizer=tok, prompt="Hi", max_new_tokens=max_new_tokens, schedule="auto")


def test_a_call_remembers_its_costs_and_calibration(tok, pair):  # the next test sees them cleared
    run_auto(tok, *pair)
    assert recall(*pair) is not None and recall_calibration(*pair, GREEDY) is not None


def test_every_test_starts_with_nothing_remembered(pair):
    assert recall(*pair) is None and recall_calibration(*pair, GREEDY) is None


def test_reset_remembered_state_clears_every_pair(tok, pair):
    run_auto(tok, *pair)
    run_auto(tok, pair[0], None)
    assisted.reset_remembered_state()
    assert recall(*pair) is None and recall(pair[0], None) is None and recall_calibration(*pair, GREEDY) is None
    assert run_auto(tok, *pair).stats.k_trace[:3] == (5, 5, 0)  # warms up again, as in a fresh process


def test_a_later_process_recalls_the_costs_from_the_machine_s_file(tok, pair, tmp_path, monkeypatch):
    """With a cost folder, a pair's costs outlive the process (a new process is memory cleared): recalled for models
    of the same architecture and size, threads and kernels, not for another pair, thread count or copy of the C++
    ops; a damaged file reads as none; the reset removes the files."""
    from assisted.policy import costs as remembered

    monkeypatch.setenv("STRUCTSPEC_COST_CACHE", str(tmp_path))
    table = CostTable(target=((1, 0.04, 1.0), (3, 0.06, 2.0)), draft_per_token=0.01, catch_up=0.002)
    memorize(*pair, table)
    with remembered._LOCK:
        remembered._MEMORY.clear()  # what a new process starts with
    other = tiny_gpt2(V, seed=4, layers=2, hidden=64)  # the models are named by architecture and size: not these
    assert recall(*pair) == table and recall(pair[0], None) is None and recall(pair[0], other) is None
    with remembered._LOCK:
        remembered._MEMORY.clear()
    with torch.inference_mode(), threads(2):
        assert recall(*pair) is None  # another thread count: another device key, another file
    (file,) = tmp_path.glob("costs-*.json")
    monkeypatch.setattr(remembered, "sources_digest", lambda: "other kernels")
    with remembered._LOCK:
        remembered._MEMORY.clear()
    assert recall(*pair) is None  # costs measured on another copy of the C++ ops: not recalled
    monkeypatch.undo()
    monkeypatch.setenv("STRUCTSPEC_COST_CACHE", str(tmp_path))
    file.write_text(file.read_text()[:-7])
    with remembered._LOCK:
        remembered._MEMORY.clear()
    assert recall(*pair) is None
    memorize(*pair, table)
    assisted.reset_remembered_state()
    assert not list(tmp_path.glob("costs-*")) and recall(*pair) is None
    monkeypatch.setenv("STRUCTSPEC_COST_CACHE", "off")
    memorize(*pair, table)
    assert not list(tmp_path.glob("costs-*"))


@pytest.fixture
def busy_switching():
    """Threads switch every microsecond: races show up in a few rounds."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_concurrent_calls_give_the_sequential_ids_and_leave_a_consistent_memory(tok, pair, busy_switching,
                                                                              plain_reference):
    target, helper = pair
    # greedy: cuts are lossless
    expected = plain_reference(target, tokenizer=tok, prompt="Hi", max_new_tokens=10).token_ids
    assistants = [helper, target, None]
    with ThreadPoolExecutor(6) as pool:
        outputs = list(pool.map(lambda i: run_auto(tok, target, assistants[i % 3]).token_ids, range(12)))
    assert outputs == [expected] * 12
    for assistant in assistants:
        assert recall(target, assistant) is not None


def test_the_registry_survives_threads_that_memorize_recall_and_reset_at_once(busy_switching):
    targets = [torch.nn.Linear(2, 2) for _ in range(4)]
    assistants = [torch.nn.Linear(2, 2) for _ in range(4)]
    errors, start = [], threading.Barrier(9)

    def writer(t):
        start.wait()
        try:
            for round_ in range(200):
                for a in assistants:
                    memorize(targets[t], a, CostTable(draft_per_token=float(round_)), object(), GREEDY)
                    recall(targets[t], a)
                    recall_calibration(targets[t], a, GREEDY)
        except Exception as error:  # noqa: BLE001 - any exception is the failure this test looks for
            errors.append(error)

    def resetter():
        start.wait()
        for _ in range(50):
            assisted.reset_remembered_state()

    workers = [threading.Thread(target=writer, args=(t % 4,)) for t in range(8)] + [threading.Thread(target=resetter)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    for t in targets:  # the registry still works after the storm
        memorize(t, assistants[0], CostTable(draft_per_token=1.0))
        assert recall(t, assistants[0]).draft_per_token == 1.0


def test_a_target_quantized_in_place_measures_its_own_costs(tok):
    """Costs belong to the target's kernels too: a float target made int4 (or int8) in place is another target to
    `auto`, so the float forwards' costs are not recalled for it."""
    from assisted.models.int4_models import quantize_int4
    from tests.helpers_models import tiny_llama

    target, helper = tiny_llama(V, seed=2, hidden=64), tiny_llama(V, seed=3, hidden=64)
    run_auto(tok, target, helper)
    assert recall(target, helper) is not None
    quantize_int4(target)
    assert recall(target, helper) is None
    run_auto(tok, target, helper)
    assert recall(target, helper) is not None


@pytest.mark.parametrize("catch_up, starts", [(1.0, False), (1e-9, True)])
def test_the_assistant_starts_once_plain_steps_have_lost_what_its_catch_up_costs(tok, pair, catch_up, starts):
    run_auto(tok, *pair)  # measures the pair's costs
    costs = recall(*pair)
    plain_rate = 1 / costs.curve(1)[1]
    memorize(*pair, replace(costs, catch_up=catch_up, drafting_rate=2 * plain_rate))  # drafting saves half a step
    out = run_auto(tok, *pair, max_new_tokens=12)
    assert (out.stats.assistant_forward_passes > 0) == starts
    assert out.token_ids == run_auto(tok, pair[0], None, max_new_tokens=12).token_ids  # lossless either way

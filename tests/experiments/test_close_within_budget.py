"""experiments.close_within_budget: its comparisons of objects, its budgets, and a tiny end-to-end run."""

from __future__ import annotations

import pytest

from experiments import close_within_budget as cwb
from experiments.lib.tasks import set_eos
from tests.helpers_models import tiny_llama


def test_leaves_and_comparison():
    room = {"a": "hello", "n": 3, "xs": [{"b": "x"}, {"b": "y"}], "e": ""}
    closed = {"a": "he", "n": 3, "xs": [{"b": "x"}], "e": ""}
    assert cwb.leaves(room)["/xs"] == ("list", 2) and cwb.leaves(room)["/xs/1/b"] == "y"
    found = cwb.compare(room, closed)
    assert found["cut_strings"] == 1 and found["cut_lists"] == 1
    assert found["leaves_room"] == 5 and found["leaves_on"] == 4  # "" is not filled
    assert found["kept"] == pytest.approx(3 / 6)  # n, e and xs/0/b kept; a, xs (its length) and xs/1/b not
    assert cwb.compare(None, closed)["kept"] == "" and cwb.compare(room, None)["leaves_on"] == ""


def test_budgets_run_from_tight_to_loose():
    assert cwb.budgets_of(["tight", "64", "96", "20"], 30) == [34, 64, 96]
    args = cwb.parse_args(["--out", "x"])
    assert args.budgets[0] == "tight" and args.temperatures == [0.0, 0.7, 1.5] and not args.cost


def test_a_tiny_run_closes_every_object(smol_tokenizer, tmp_path):
    model = tiny_llama(len(smol_tokenizer), seed=0)
    set_eos(smol_tokenizer, model)
    args = cwb.parse_args(["--tasks", "recipe", "--budgets", "tight", "--temperatures", "0", "1.5", "--seeds", "1",
                           "--room", "48", "--out", str(tmp_path)])
    rows = cwb.measure(model, smol_tokenizer, None, args)
    assert len(rows) == 2 and all(r["valid_on"] for r in rows)
    assert all(r["tokens_on"] <= r["budget"] == r["shortest"] + 4 for r in rows)
    text = cwb.readme(args, ["--tasks", "recipe"], rows)
    assert "| recipe |" in text and "valid with" in text
    args.cost = True
    assert "paired runs" in "\n".join(cwb.cost_lines(
        [{**r, "seconds_on": 1.0, "seconds_off": 1.0, "tokens_off": max(r["tokens_off"], 1)} for r in rows]))

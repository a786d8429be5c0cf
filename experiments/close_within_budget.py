"""Valid within the token budget: validity with and without `close_within_budget`, how far the closed objects are
from the ones the model writes given room, and what the tighter mask costs per token.

Per (task, temperature, seed) one run with room, and per budget the runs at it, by `assisted.generate`, same seed:
  room    max_new_tokens = --room (the object the model writes when the budget is not what stops it)
  off     max_new_tokens = budget, without the option: the room run cut at the budget (the same seed and masks give
          the same tokens; checked once per task), or with `--cost` a run of its own, timed
  on      max_new_tokens = budget, close_within_budget=True
Budgets go from tight (the task's shortest completion + 4) to loose; temperatures from greedy to 1.5.
A closed object is compared with `room`'s (when that one is valid) leaf by leaf: leaves filled, leaves kept
equal, string values cut short (a proper prefix of `room`'s) and lists cut short.

With `--cost`, the runs are also timed (wall seconds and the guide's seconds per new token, `on` against `off`,
paired per unit, alternating which runs first); use it on the Qwen pair with the assistant, as the speedup figures.

    python -m experiments.close_within_budget --target smollm2-135m --out experiments/results/close-within-budget-...
    python -m experiments.close_within_budget --target qwen2.5-coder-1.5b --assistant qwen2.5-coder-0.5b \\
        --assistant-int4 --pack --budgets 96 --temperatures 0 1.5 --seeds 2 --cost --out ...
"""

from __future__ import annotations

import statistics
import sys
import time

from pydantic import BaseModel

import fsm
from assisted import generate
from experiments.lib import cli
from experiments.lib.intervals import paired_ratio
from experiments.lib.report import run_lines, table, write_rows
from experiments.lib.tasks import BUDGET as TASKS, Task

FIELDS = ("task", "budget", "temperature", "seed", "shortest", "valid_room", "valid_off", "valid_on", "stop_on",
          "tightened", "tokens_room", "tokens_off", "tokens_on", "leaves_room", "leaves_on", "kept", "cut_strings",
          "cut_lists", "seconds_off", "seconds_on", "fsm_off", "fsm_on", "text_on")


def parse_args(argv: list[str]):
    parser = cli.parser("close_within_budget", __doc__)
    cli.add_models(parser, target="smollm2-135m", assistant=None)
    parser.add_argument("--tasks", nargs="+", choices=[t.name for t in TASKS], default=[t.name for t in TASKS])
    parser.add_argument("--budgets", nargs="+", default=["tight", "64", "96", "128"],
                        help="max_new_tokens values; 'tight' is the task's shortest completion + 4")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per sampled temperature (greedy: one)")
    parser.add_argument("--room", type=int, default=192, help="max_new_tokens of the run with room")
    parser.add_argument("--cost", action="store_true", help="time the runs (warm-up first)")
    cli.add_run(parser, repeats=None, max_new_tokens=None, seed=False, temperatures=[0.0, 0.7, 1.5])
    return parser.parse_args(argv)


def run_case(model, tokenizer, assistant, task: Task, budget: int, temperature: float, seed: int, roomy,
             timed: bool, order: int) -> dict:
    """The runs of one case at `budget` and the comparison of the closed object with the `roomy` one.

    Without `timed`, the run without the option is `roomy` cut at the budget: the same seed and masks give the same
    tokens up to there (checked in `measure`); with `timed`, both runs are made and timed, alternating which first.
    """
    kw = case_options(tokenizer, task, temperature, seed)
    runs = {}
    for flag in ((False, True) if order % 2 == 0 else (True, False)) if timed else (True,):
        start = time.perf_counter()
        out = generate(model, assistant, max_new_tokens=budget, close_within_budget=flag, **kw)
        runs[flag] = (out, time.perf_counter() - start)
    on, on_s = runs[True]
    off, off_s = runs.get(False, (None, 0.0))
    off_tokens = len(off.token_ids) if off else min(len(roomy.token_ids), budget)
    valid_off = off.value is not None if off else roomy.value is not None and len(roomy.token_ids) <= budget
    return {"task": task.name, "budget": budget, "temperature": temperature, "seed": seed,
            "valid_room": roomy.value is not None, "valid_off": valid_off,
            "valid_on": on.value is not None, "stop_on": on.stop_reason, "tightened": on.stats.budget_tightened,
            "tokens_room": len(roomy.token_ids), "tokens_off": off_tokens, "tokens_on": len(on.token_ids),
            **compare(dump(roomy.value), dump(on.value)),
            "seconds_off": off_s, "seconds_on": on_s, "fsm_off": off.stats.seconds.fsm if off else 0.0,
            "fsm_on": on.stats.seconds.fsm, "text_on": on.text}


def case_options(tokenizer, task: Task, temperature: float, seed: int) -> dict:
    return dict(tokenizer=tokenizer, messages=task.messages(), schema=task.schema, seed=seed,
                do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0,
                num_assistant_tokens_schedule="heuristic")


def dump(value):
    return None if value is None else value.model_dump() if isinstance(value, BaseModel) else value


def leaves(value, path: str = "") -> dict:
    """path -> scalar or ("list", length): a JSON value flattened."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        inner = {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}/{i}").items()}
        return {path: ("list", len(value)), **inner}
    return {path: value}


def filled(value) -> bool:
    return value not in ("", ("list", 0))


def compare(room, closed) -> dict:
    """Leaves filled in each, leaves of the roomy object kept equal, strings and lists the closed one cut short."""
    if closed is None:
        return {"leaves_room": "", "leaves_on": "", "kept": "", "cut_strings": "", "cut_lists": ""}
    mine = leaves(closed)
    if room is None:
        return {"leaves_room": "", "leaves_on": sum(map(filled, mine.values())), "kept": "", "cut_strings": "",
                "cut_lists": ""}
    theirs = leaves(room)
    cut_strings = sum(isinstance(v, str) and isinstance(theirs.get(p), str) and v != theirs[p]
                      and theirs[p].startswith(v) for p, v in mine.items())
    cut_lists = sum(isinstance(v, tuple) and isinstance(theirs.get(p), tuple) and v[1] < theirs[p][1]
                    for p, v in mine.items())
    return {"leaves_room": sum(map(filled, theirs.values())), "leaves_on": sum(map(filled, mine.values())),
            "kept": sum(mine.get(p) == v for p, v in theirs.items()) / len(theirs), "cut_strings": cut_strings,
            "cut_lists": cut_lists}


def shortest(task: Task, tokenizer, vocab_size: int) -> int:
    return fsm.Guide.from_schema(task.schema, tokenizer, vocab_size=vocab_size).shortest_completion()


def budgets_of(names: list[str], low: int) -> list[int]:
    """The budgets asked for, 'tight' as low + 4, those below `low` left out, in increasing order."""
    values = {low + 4 if name == "tight" else int(name) for name in names}
    return sorted(v for v in values if v >= low)


def measure(model, tokenizer, assistant, args) -> list[dict]:
    vocab = model.get_output_embeddings().weight.shape[0]
    tasks = [t for t in TASKS if t.name in args.tasks]
    if args.cost:  # untimed: indexes and budget tables built, allocators warm
        for task in tasks:
            for flag in (False, True):
                generate(model, assistant, tokenizer=tokenizer, messages=task.messages(), schema=task.schema,
                         max_new_tokens=24 + shortest(task, tokenizer, vocab), close_within_budget=flag)
    rows = []
    for task in tasks:
        low = shortest(task, tokenizer, vocab)
        for temperature in args.temperatures:
            for seed in range(1 if temperature == 0 else args.seeds):
                roomy = generate(model, assistant, max_new_tokens=args.room,
                                 **case_options(tokenizer, task, temperature, seed))
                for budget in budgets_of(args.budgets, low):
                    rows.append({**run_case(model, tokenizer, assistant, task, budget, temperature, seed, roomy,
                                            args.cost, len(rows)), "shortest": low})
                    print(f"{task.name:9} budget {budget:4d} T {temperature:.1f} seed {seed}: valid off "
                          f"{rows[-1]['valid_off']:d} on {rows[-1]['valid_on']:d} ({rows[-1]['stop_on']}, "
                          f"{rows[-1]['tightened']} tightened) kept {rows[-1]['kept']}", file=sys.stderr)
        if not args.cost:
            check_cut(model, tokenizer, assistant, task, low + 4)
    return rows


def check_cut(model, tokenizer, assistant, task: Task, budget: int) -> None:
    """The run without the option at `budget` is the roomy run cut there (what the untimed rows rely on)."""
    kw = case_options(tokenizer, task, 1.5, 0)
    cut = generate(model, assistant, max_new_tokens=budget, **kw)
    roomy = generate(model, assistant, max_new_tokens=budget + 8, **kw)
    if cut.token_ids != roomy.token_ids[:budget]:
        raise RuntimeError(f"{task.name}: the run at {budget} tokens is not the longer run cut there")


def validity_table(rows: list[dict]) -> list[str]:
    """Valid objects without and with the option, per task and budget (all temperatures and seeds)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["task"], r["budget"]), []).append(r)
    cells = []
    for (task, budget), group in groups.items():
        kept = [r["kept"] for r in group if r["kept"] != ""]
        cells.append([task, group[0]["shortest"], budget, *_validity(group),
                      f"{statistics.mean(kept):.2f} ({len(kept)})" if kept else "-",
                      sum(int(r["cut_strings"] or 0) for r in group), sum(int(r["cut_lists"] or 0) for r in group)])
    return table(["task", "shortest", "budget", "runs", "valid without", "valid with", "closed by the budget",
                  "leaves kept", "strings cut", "lists cut"], cells)


def per_temperature(rows: list[dict]) -> list[str]:
    return table(["temperature", "runs", "valid without", "valid with", "closed"],
                 [[t, *_validity([r for r in rows if r["temperature"] == t])]
                  for t in sorted({r["temperature"] for r in rows})])


def _validity(group: list[dict]) -> list[int]:
    """Runs, valid without and with the option, and closed by the budget."""
    return [len(group), sum(r["valid_off"] for r in group), sum(r["valid_on"] for r in group),
            sum(r["stop_on"] == "closed" for r in group)]


def cost_lines(rows: list[dict]) -> list[str]:
    """Seconds per token with the option over without, paired per run, and the guide's share of it."""
    pairs = [(r["seconds_on"] / max(r["tokens_on"], 1), r["seconds_off"] / max(r["tokens_off"], 1)) for r in rows]
    ratio, low, high = paired_ratio(pairs)
    fsm_on = sum(r["fsm_on"] for r in rows) / sum(r["tokens_on"] for r in rows)
    fsm_off = sum(r["fsm_off"] for r in rows) / sum(r["tokens_off"] for r in rows)
    per_token = statistics.median(r["seconds_off"] / max(r["tokens_off"], 1) for r in rows)
    return [f"- wall seconds per token, with the option / without (geometric mean over {len(rows)} paired runs, 90% "
            f"interval): {ratio:.3f} [{low:.3f}, {high:.3f}]",
            f"- the guide's seconds per token (masks, budget tables, forced runs): {1000 * fsm_on:.2f} ms with the "
            f"option, {1000 * fsm_off:.2f} ms without; the difference is {100 * (fsm_on - fsm_off) / per_token:.2f}% "
            f"of the median {1000 * per_token:.0f} ms a token takes without it"]


def readme(args, argv: list[str], rows: list[dict]) -> str:
    helper = cli.assistant_label(args) if args.assistant else "none"
    lines = [f"# Valid within the token budget: {args.out.name}", "",
             *run_lines("experiments.close_within_budget", argv),
             f"- target {cli.target_label(args)}, assistant {helper}, heuristic schedule, "
             f"coalesced forced tokens; room run max_new_tokens {args.room}",
             f"- tasks {', '.join(args.tasks)} (the first three written for this run, invoice from "
             "experiments.lib.tasks.HELD_OUT); temperatures " + ", ".join(map(str, args.temperatures)) +
             f", {args.seeds} seed(s) per sampled temperature", "",
             "## Validity", "", *validity_table(rows), "", *per_temperature(rows), "",
             "\"valid without\": the run at the budget without the option (cut objects are invalid); \"valid with\": "
             "close_within_budget=True; \"closed by the budget\": stop reason \"closed\" (the budget tightened a mask "
             "on the way). Leaves kept: the share of the leaves of the object written with room (max_new_tokens "
             f"{args.room}, when valid: the count in brackets) that the closed object has equal; strings / lists cut: "
             "closed values that are a proper prefix of the roomy one's / shorter lists.", ""]
    if args.cost:
        lines += ["## Cost per token", "", *cost_lines(rows), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv, args = cli.begin(parse_args, argv)
    model, tokenizer, assistant = cli.load(args)
    rows = measure(model, tokenizer, assistant, args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "results.csv", rows, FIELDS)
    (args.out / "README.md").write_text(readme(args, argv, rows) + "\n")
    print(readme(args, argv, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

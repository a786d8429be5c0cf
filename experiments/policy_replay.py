"""Replay candidate-length policies on recorded acceptance traces: policy comparisons without timing noise.

    python -m experiments.policy_replay collect --target qwen2.5-coder-1.5b --assistant qwen2.5-coder-0.5b \
        --assistant-int8 --packed-target --threads 1 --out experiments/results/<run>
    python -m experiments.policy_replay replay --out experiments/results/<run>

A sampled cell of the speedup experiment is one sample per prompt and system, and samples differ per system
(a lucky text is accepted at 0.9, an unlucky one at 0.3), so cells move by 30% between runs and a policy
change of 5% is invisible. Here the text and the costs are fixed and only the policy varies.

`collect` samples the target's texts (`--paths` per prompt and sampled temperature; greedy has one; written
with the assistant's help, which is lossless: the same texts, faster), then runs each model once over
prompt + text and records per position t:
  acceptance[t]  the chance that the assistant's draft at t is accepted: sum_x min(p_t(x), q_t(x)) when
                 sampling (speculative sampling), 1 if the argmaxes agree else 0 when greedy;
  confidence[t]  the assistant's confidence there, as `drafting.assistant.pick` computes it (max of q at T = 1).
It also times the target's forward over n = 1..k_max + 1 tokens and the assistant's forward over one token.

`replay` drives each policy through every trace `--seeds` times: a step drafts from the current position
with the trace's confidences (asking the policy's `cut` after each, as the loop does: when sampling a cut
only drops the last draft), the target accepts draft i with probability acceptance[pos + i] until the first
rejection, and the step costs target(verified + 1) + drafted * assistant + `--overhead`, times lognormal
noise of `--noise`. Greedy replays are exact up to the drafts after a rejection (they follow the text
here, the assistant's own continuation in a real run; they are never judged either way). Sampled replays
draw acceptance independently per position: a draft's acceptance and the text after it are not coupled.
`--timings` replays at the costs of a forward-cost table instead (layout, n, repeat, seconds:
`experiments.gpu_check`'s costs.csv; another machine, or the same one in another state). `auto` starts each call
from the costs of a warmed process and the calibration of the latest call at the same temperature on another
prompt, as `generate` would in one process.
Besides our policies, two stand-ins for transformers' schedules run in the same model of time (they are
not transformers' code, whose per-step overhead is larger): "constant-20" and "heuristic-5", each
stopping a draft after a token the assistant is less than 0.4 sure of (transformers' defaults). Two references
bracket them (`planned`, dynamic programming over each text): the "bound" knows every position's acceptance,
and the "confidence plan" knows every position's confidence and the calibration over all texts at its
temperature, which a causal policy learns only by drafting.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import random
import statistics
import sys
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from assisted.policy.auto import CONFIDENCE_BINS, Auto, AutoConfig, confidence_bins  # noqa: E402
from assisted.policy.costs import CostTable, StepCost  # noqa: E402
from assisted.policy.draft_policy import Constant, Heuristic, Policy  # noqa: E402
from experiments.lib.prompt_split import HALVES, SPLIT_PROMPTS  # noqa: E402
from experiments.lib import cli  # noqa: E402
from experiments.lib.timing import forward_costs  # noqa: E402

CONFIDENCE_STOP = 0.4  # transformers' assistant_confidence_threshold default


@dataclass(frozen=True)
class Trace:
    """One text and what each position offers a drafting policy."""

    cls: str
    prompt: str
    temperature: float
    path: int
    acceptance: tuple[float, ...]  # [t]: P(the assistant's draft at t is accepted | the text before t)
    confidence: tuple[float, ...]  # [t]: the assistant's confidence at t


@dataclass(frozen=True)
class Costs:
    """Seconds of a target forward over n tokens ([n], n = 0..) and of one assistant token."""

    target: tuple[float, ...]
    draft: float

    def table(self, cost_decay: float = 0.9) -> CostTable:
        """The table a warmed process would hold (every n measured once)."""
        table = CostTable()
        for n, seconds in enumerate(self.target[1:], start=1):
            table = table.with_target(n, seconds, cost_decay)
        return table.with_draft(self.draft, cost_decay)


# ---- replay (pure; no models) ------------------------------------------------------------------------------

class ConfidenceStop:
    """A policy that also stops a draft after a token the assistant is less than `threshold` sure of."""

    def __init__(self, policy: Policy, threshold: float = CONFIDENCE_STOP):
        self.policy, self.threshold = policy, threshold

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def cut(self, confidence: tuple[float, ...]) -> int | None:
        return len(confidence) if confidence[-1] < self.threshold else None


class Remembering:
    """Makes `Auto` policies as `generate` does in one process: each starts from the costs of a warmed process
    and the calibration (`assisted.policy.costs.recall_calibration`) that the latest call at the same temperature on
    another prompt ended with: replays of one text never learn from each other."""

    def __init__(self, costs: Costs, config: AutoConfig | None = None):
        self.costs, self.config, self.last = costs.table(), config, {}  # temperature -> {prompt: latest policy}

    def __call__(self, trace: Trace) -> Auto:
        latest = self.last.setdefault(trace.temperature, {})  # insertion order: the latest call per prompt last
        earlier = next((p for name, p in reversed(latest.items()) if name != trace.prompt), None)
        policy = Auto(5, self.config, self.costs, None if earlier is None else earlier.calibration())
        latest.pop(trace.prompt, None)
        latest[trace.prompt] = policy  # replayed next: its calibration is final when a later call asks
        return policy


def make_policies(costs: Costs, config: AutoConfig | None = None, fixed: tuple[int, ...] = ()) -> dict:
    """name -> factory of a fresh policy for a trace; `fixed` adds "fixed-k" (k drafts every step, no cut)."""
    policies = {"plain": lambda _: Constant(0),
                "heuristic": lambda _: Heuristic(5),
                "auto": Remembering(costs, config),
                "constant-20": lambda _: ConfidenceStop(Constant(20)),
                "heuristic-5": lambda _: ConfidenceStop(Heuristic(5))}
    return policies | {f"fixed-{k}": (lambda _, k=k: Constant(k)) for k in fixed}


def replay(policy: Policy, trace: Trace, costs: Costs, uniforms: list[float], sampling: bool, overhead: float = 0.0,
           noise: float = 0.0, rng: random.Random | None = None) -> tuple[int, float, int]:
    """Decode the trace's text with `policy`; returns (tokens, seconds, target forwards).

    A draft at position t is accepted when uniforms[t] < acceptance[t]: every policy replayed with the same
    uniforms meets the same luck at each position (common random numbers), so their difference is the policy's.
    `rng` draws the timing noise.
    """
    acc, conf, n_max = trace.acceptance, trace.confidence, len(costs.target) - 2
    pos = seconds = forwards = 0
    while pos < len(acc):
        k, drafts, kept = min(policy.k, n_max, len(acc) - pos - 1), [], None
        while len(drafts) < k and kept is None:
            drafts.append(conf[pos + len(drafts)])
            kept = policy.cut(tuple(drafts))
            if kept is not None and sampling:
                kept = max(kept, len(drafts) - 1)
        verified = len(drafts) if kept is None else kept
        accepted = 0
        while accepted < verified and uniforms[pos + accepted] < acc[pos + accepted]:
            accepted += 1
        judged = min(accepted + 1, verified)
        jitter = math.exp(rng.gauss(0.0, noise)) if noise and rng is not None else 1.0
        target, draft = costs.target[verified + 1] * jitter, costs.draft * len(drafts) * jitter
        policy.update(judged, accepted, StepCost(verified + 1, target, len(drafts), draft), tuple(drafts[:verified]))
        pos, seconds, forwards = pos + accepted + 1, seconds + target + draft + overhead, forwards + 1
    return len(acc), seconds, forwards


def planned(trace: Trace, costs: Costs, overhead: float = 0.0, belief: np.ndarray | None = None) -> float:
    """Expected seconds to decode the trace with the draft lengths that are best if each position's acceptance
    were `belief` (default: the trace's own acceptance).

    Dynamic programming from the end: from position t a step drafts k tokens (k = 0..n_max, no cut) and
    commits a + 1 tokens, a the accepted run, P(a) = acc[t] ... acc[t+a-1] (1 - acc[t+a]). The k per position
    is chosen under `belief`, and the seconds are expected under the trace's acceptance. With the trace's own
    acceptance this is a bound: no causal policy does better in the replay's model of time (greedy, it knows
    where the target disagrees; sampling, each position's chance, not the draw).
    """
    acc = np.asarray(trace.acceptance, dtype=float)
    plan = _draft_lengths(acc if belief is None else np.asarray(belief, dtype=float), costs, overhead)
    rest = np.zeros(len(acc) + 1)  # [t]: expected seconds from position t to the end
    for t in range(len(acc) - 1, -1, -1):
        rest[t] = _step(acc, rest, t, plan[t], costs, overhead)
    return float(rest[0])


def _draft_lengths(acc: np.ndarray, costs: Costs, overhead: float) -> list[int]:
    """[t]: the draft length that minimizes the expected seconds from position t to the end, acceptance `acc`."""
    n_max, rest, plan = len(costs.target) - 2, np.zeros(len(acc) + 1), [0] * len(acc)
    for t in range(len(acc) - 1, -1, -1):
        ks = range(min(n_max, len(acc) - t - 1) + 1)
        rest[t], plan[t] = min((_step(acc, rest, t, k, costs, overhead), k) for k in ks)
    return plan


def _step(acc: np.ndarray, rest: np.ndarray, t: int, k: int, costs: Costs, overhead: float) -> float:
    """Expected seconds of a k-draft step from position t plus those from where it ends (`rest`)."""
    survival = np.concatenate([[1.0], np.cumprod(acc[t : t + k])])  # [a]: P(the first a drafts accepted)
    runs = survival * np.append(1.0 - acc[t : t + k], 1.0)  # [a]: P(exactly a accepted), a = 0..k
    return costs.target[k + 1] + k * costs.draft + overhead + float(runs @ rest[t + 1 : t + k + 2])


def calibrated(traces: list[Trace]) -> list[np.ndarray]:
    """Per trace, [t]: the mean acceptance of its confidence bin (`assisted.policy.auto.CONFIDENCE_BINS`) over all
    traces at its temperature: what a policy that knew the calibration exactly would believe."""
    tables = {}
    for temperature in {t.temperature for t in traces}:
        same = [t for t in traces if t.temperature == temperature]
        acc = np.concatenate([t.acceptance for t in same])
        bins = confidence_bins(np.concatenate([t.confidence for t in same]))
        tables[temperature] = np.bincount(bins, acc, len(CONFIDENCE_BINS)) / np.maximum(
            np.bincount(bins, minlength=len(CONFIDENCE_BINS)), 1)
    return [tables[t.temperature][confidence_bins(np.asarray(t.confidence))] for t in traces]


def replay_all(traces: list[Trace], costs: Costs, policies: dict, seeds: int, overhead: float, noise: float
               ) -> list[dict]:
    """One row per (trace, seed, policy): seconds per token and target forwards; and per trace, expected
    seconds per token (no draws) of the "bound" and of the "confidence plan" (`planned` with the trace's own
    acceptance, and with the `calibrated` acceptance of its confidences)."""
    rows = []
    for trace, belief in zip(traces, calibrated(traces)):
        for name, seconds in (("bound", planned(trace, costs, overhead)),
                              ("confidence plan", planned(trace, costs, overhead, belief))):
            rows.append({"class": trace.cls, "prompt": trace.prompt, "temperature": trace.temperature,
                         "path": trace.path, "seed": 0, "policy": name, "per_token": seconds / len(trace.acceptance),
                         "forwards": math.nan, "tokens": len(trace.acceptance)})
        for seed in range(1 if trace.temperature == 0 and not noise else seeds):
            key = zlib.crc32(f"{trace.prompt} {trace.temperature} {trace.path} {seed}".encode())
            draws = random.Random(key)
            uniforms = [draws.random() for _ in trace.acceptance]
            for name, make in policies.items():
                tokens, seconds, forwards = replay(make(trace), trace, costs, uniforms, trace.temperature > 0, overhead,
                                                   noise, random.Random(key + 1))
                rows.append({"class": trace.cls, "prompt": trace.prompt, "temperature": trace.temperature,
                             "path": trace.path, "seed": seed, "policy": name, "per_token": seconds / tokens,
                             "forwards": forwards, "tokens": tokens})
    return rows


def summarize(rows: list[dict]) -> dict:
    """{(class, temperature, policy): mean seconds per token}: every cell replays the same texts and draws."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["class"], r["temperature"], r["policy"]), []).append(r["per_token"])
    return {key: statistics.fmean(v) for key, v in groups.items()}


def report(summary: dict, policies: list[str]) -> list[str]:
    """Markdown: each policy's speedup over plain decoding per cell, auto over the best other policy, and the
    share of the confidence plan's and of the bound's speed that auto reaches."""
    others = [p for p in policies if p not in ("plain", "auto")]
    shown = [p for p in policies if p != "plain"] + ["confidence plan", "bound"]
    lines = ["| class | T | " + " | ".join(shown) + " | auto / best other | auto / confidence plan | auto / bound |",
             "|---" * (len(shown) + 5) + "|"]
    for c in sorted({c for c, _, _ in summary}):
        for t in sorted({t for _, t, _ in summary}):
            plain, auto = summary[(c, t, "plain")], summary[(c, t, "auto")]
            speedups = [f"{plain / summary[(c, t, p)]:.2f}" for p in shown]
            best = min(summary[(c, t, p)] for p in others)
            plan, limit = summary[(c, t, "confidence plan")], summary[(c, t, "bound")]
            lines.append(f"| {c} | {t} | " + " | ".join(speedups)
                         + f" | {best / auto:.2f} | {plan / auto:.2f} | {limit / auto:.2f} |")
    return lines


TRANSFORMERS_STAND_INS = ("constant-20", "heuristic-5")


def headroom(summary: dict) -> list[str]:
    """Markdown: `auto`, the confidence plan and the bound over each stand-in for transformers' schedules,
    geometric mean over the cells with the range: how far a causal policy, one that knew every confidence ahead,
    and one that knew every acceptance could lead them at these costs."""
    cells = sorted({(c, t) for c, t, _ in summary})
    lines = ["| over | auto | confidence plan | bound |", "|---|---|---|---|"]
    for base in TRANSFORMERS_STAND_INS:
        cols = []
        for who in ("auto", "confidence plan", "bound"):
            ratios = np.array([summary[(c, t, base)] / summary[(c, t, who)] for c, t in cells])  # (cells,)
            cols.append(f"{float(np.exp(np.log(ratios).mean())):.3f} ({ratios.min():.2f}-{ratios.max():.2f})")
        lines.append(f"| {base} | " + " | ".join(cols) + " |")
    return lines


# ---- collect (models) --------------------------------------------------------------------------------------

def trace_of(model, assistant, prompt_caches: tuple, ids: list[int], text: list[int], temperature: float
             ) -> tuple[list, list]:
    """(acceptance, confidence) per position of `text` after the prompt `ids`, whose first len(ids) - 1
    tokens each model's cache in `prompt_caches` holds (cropped back to that afterwards)."""
    from drafting.kv_cache import crop_to, forward
    rows = []
    for m, cache in zip((model, assistant), prompt_caches):
        rows.append(forward(m, cache, ids[-1:] + text, len(text) + 1)[:-1].float())  # (L, V): rows predicting text
        crop_to(cache, len(ids) - 1)
    v = min(r.shape[-1] for r in rows)
    p_logits, q_logits = rows[0][:, :v], rows[1][:, :v]
    confidence = q_logits.softmax(-1).max(-1).values  # (L,)
    if temperature == 0:
        acceptance = (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    else:
        p, q = (p_logits / temperature).softmax(-1), (q_logits / temperature).softmax(-1)
        acceptance = torch.minimum(p, q).sum(-1).clamp(max=1.0)
    return acceptance.tolist(), confidence.tolist()


def time_costs(model, assistant, ids: list[int], n_max: int, repeats: int = 3) -> Costs:
    """Median seconds of target forwards over n = 1..n_max tokens after the prompt, and of one assistant token."""
    target = forward_costs(model, ids, range(1, n_max + 1), repeats, warmup=False)
    draft = forward_costs(assistant, ids, [1], 5 * repeats, warmup=False)[1]
    return Costs((0.0, *(target[n] for n in range(1, n_max + 1))), draft)


def collect(args) -> int:
    from assisted import generate
    from drafting.kv_cache import forward, new_cache
    from experiments.lib.prompt_split import load_prompts
    from experiments.lib.tasks import chat_ids
    loaded = cli.load(args)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    prompts, traces = load_prompts(args.prompts, None if args.half == "all" else args.half, args.per_class), []
    with torch.inference_mode():
        costs = time_costs(model, assistant, chat_ids(tokenizer, prompts[0]), AutoConfig().k_max + 1)
        torch.set_num_threads(os.cpu_count() or 1)  # the texts and traces need no timing
        for p in prompts:
            ids = chat_ids(tokenizer, p)
            caches = (new_cache(), new_cache())
            for m, cache in zip((model, assistant), caches):
                forward(m, cache, ids[:-1], 1)
            for t in args.temperatures:
                for path in range(1 if t == 0 else args.paths):
                    # assisted sampling is lossless: the texts are the target's, written faster
                    out = generate(model, assistant, tokenizer=tokenizer, input_ids=ids,
                                   max_new_tokens=args.max_new_tokens, do_sample=t > 0,
                                   temperature=t if t > 0 else 1.0, seed=2000 + path)
                    acceptance, confidence = trace_of(model, assistant, caches, ids, list(out.token_ids), t)
                    traces.append(Trace(p["class"], p["name"], t, path, tuple(round(a, 4) for a in acceptance),
                                        tuple(round(c, 4) for c in confidence)))
                    print(f"{p['name']} T{t} path {path}: {len(acceptance)} tokens, "
                          f"mean acceptance {statistics.fmean(acceptance):.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    from experiments.lib.report import machine_lines

    (args.out / "traces.json").write_text(
        json.dumps(
            {
                "costs": asdict(costs),
                "command": "python -m experiments.policy_replay " + " ".join(sys.argv[1:]),
                "date": str(datetime.date.today()),
                "machine": machine_lines(),
                "traces": [asdict(t) for t in traces],
            }
        )
    )
    print(f"wrote {args.out / 'traces.json'}")
    return 0


def costs_from_timings(path: Path, layout: str, draft: float, n_max: int, where: dict | None = None,
                       draft_where: dict | None = None) -> Costs:
    """Target costs from a forward-cost timings.csv, e.g. gpu_check's costs.csv (median per n of `layout`, interpolated,
    past the largest n extended at the last slope) and the assistant's seconds per token: `draft`, or the
    median n = 1 timing of the rows matching `draft_where`. `where` keeps only the target's rows in a table of
    several (`experiments.gpu_check`'s costs.csv has model, dtype and context columns)."""
    with open(path, newline="") as f:
        table = [r for r in csv.DictReader(f) if r["layout"] == layout]
    if draft_where:
        ones = [float(r["seconds"]) for r in _matching(table, draft_where, path) if int(r["n"]) == 1]
        if not ones:
            raise ValueError(f"{path} has no n = 1 timing where {draft_where}")
        draft = statistics.median(ones)
    rows = _matching(table, where or {}, path)
    if not rows:
        raise ValueError(f"{path} has no timings of layout {layout!r} where {where or {}}")
    by_n: dict = {}
    for r in rows:
        by_n.setdefault(int(r["n"]), []).append(float(r["seconds"]))
    xs = sorted(by_n)
    ys = [statistics.median(by_n[n]) for n in xs]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    target = [0.0] + [float(np.interp(n, xs, ys)) + slope * max(n - xs[-1], 0) for n in range(1, n_max + 1)]
    return Costs(tuple(target), draft)


def _matching(rows: list[dict], where: dict, path: Path) -> list[dict]:
    """The rows whose columns hold every value in `where`."""
    missing = [k for k in where if rows and k not in rows[0]]
    if missing:
        raise ValueError(f"{path} has no column {missing[0]!r}")
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def _pairs(items: list[str] | None) -> dict:
    """["model=x", "context=200"] -> {"model": "x", "context": "200"}."""
    pairs = dict(item.split("=", 1) for item in items or [] if "=" in item)
    if len(pairs) != len(items or []):
        raise SystemExit(f"error: expected column=value, got {items}")
    return pairs


def load_traces(path: Path) -> tuple[Costs, list[Trace], dict]:
    """The costs timed at collection, the traces, and the whole file (command, date, machine)."""
    data = json.loads(Path(path).read_text())
    costs = Costs(tuple(data["costs"]["target"]), data["costs"]["draft"])
    return costs, [Trace(**{**t, "acceptance": tuple(t["acceptance"]), "confidence": tuple(t["confidence"])})
                   for t in data["traces"]], data


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("policy_replay", __doc__)
    p.add_argument("mode", choices=("collect", "replay"))
    p.add_argument("--out", type=Path, required=True, help="folder of traces.json (collect writes it, replay reads it)")
    cli.add_models(p)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompts", type=Path, default=SPLIT_PROMPTS)
    p.add_argument("--half", choices=[*HALVES, "all"], default="tuning",
                   help="which half of the prompt set; traces for tuning come from the tuning half only")
    p.add_argument("--per-class", type=int, default=None)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.3, 0.6, 0.9, 1.2])
    p.add_argument("--paths", type=int, default=4, help="sampled texts per prompt and temperature")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--seeds", type=int, default=50, help="replays per sampled text (acceptance draws)")
    p.add_argument("--overhead", type=float, default=0.002, help="seconds of loop overhead per step")
    p.add_argument("--noise", type=float, default=0.05, help="lognormal sigma of each step's timing")
    p.add_argument("--timings", type=Path, default=None,
                   help="replay at the target costs of this forward-cost timings.csv (gpu_check's costs.csv) instead "
                        "of the "
                        "costs timed when the traces were collected")
    p.add_argument("--layout", default="prepacked", help="the timings' layout to replay (dense or prepacked)")
    p.add_argument("--traces", type=Path, default=None, help="replay: traces.json to read (default: --out's)")
    p.add_argument("--where", nargs="+", default=None, metavar="COLUMN=VALUE",
                   help="with --timings: the target's rows (e.g. model=qwen2.5-coder-1.5b dtype=bfloat16 context=200)")
    p.add_argument("--draft-where", nargs="+", default=None, metavar="COLUMN=VALUE",
                   help="with --timings: the assistant's rows, whose n = 1 median is the seconds per drafted token")
    p.add_argument("--fixed", type=int, nargs="*", default=[], help="also replay fixed-k schedules (k drafts, no cut)")
    p.add_argument("--report", default="README.md", help="file name of the report written to --out")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "collect":
        return collect(args)
    return replay_report(args, "python -m experiments.policy_replay " + " ".join(argv or sys.argv[1:]))


def replay_report(args, command: str) -> int:
    costs, traces, collected = load_traces(args.traces or args.out / "traces.json")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.timings:
        costs = costs_from_timings(args.timings, args.layout, costs.draft, len(costs.target) - 1, _pairs(args.where),
                                   _pairs(args.draft_where))
    policies = make_policies(costs, fixed=tuple(args.fixed))
    rows = replay_all(traces, costs, policies, args.seeds, args.overhead, args.noise)
    summary = summarize(rows)
    timed = ", ".join(f"{costs.target[n]:.4f}" for n in (1, 2, 4, 8, 16))
    lines = [f"# Policy replay {args.out.name}", "", f"- command: `{command}`",
             f"- traces: `{collected['command']}` on {collected['date']}", *collected["machine"],
             f"- {len(traces)} texts; target seconds over n = 1, 2, 4, 8, 16 tokens: {timed}; "
             f"assistant token {costs.draft:.4f} s; {args.overhead:.4f} s loop overhead per step; "
             f"{args.seeds} draws per sampled text",
             "", "Speedup over plain decoding (mean seconds per token over texts and draws; every policy replays the "
             "same texts with the same draws):", "", *report(summary, list(policies)), "",
             "Headroom: each policy's speed over a stand-in for transformers' schedules (geometric mean over the "
             "cells, range); the confidence plan and the bound are not causal (they know what lies ahead):", "",
             *headroom(summary), ""]
    (args.out / args.report).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The default demo: structured generation with and without forced tokens (and an assistant).

    python -m experiments.demo               # SmolLM2-135M, the embedded default
    python -m experiments.demo --assistant   # Qwen2.5-Coder 1.5B target + 0.5B assistant (prepare first)

For the seed's Character example and one extraction task it prints the validated JSON and a table:
plain unconstrained generation, plain constrained decoding (mask only), constrained + coalesced forced
tokens, constrained + forced tokens + prompt lookup, and with --assistant the assistant modes ("full":
forced tokens, prompt lookup and the assistant). All greedy; speedup is against plain constrained.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from assisted import generate
from experiments.lib import cli
from experiments.lib.tasks import DEMO, Task, extract_json, validate

SMALL = "smollm2-135m"
PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
# mode -> (needs assistant, schema?, coalesce forced tokens, prompt lookup); "full" is everything we have
MODES = {"unconstrained": (False, False, False, False), "constrained": (False, True, False, False),
         "constrained+forced": (False, True, True, False), "constrained+forced+lookup": (False, True, True, True),
         "constrained+assistant": (True, True, False, False), "full": (True, True, True, True)}
BASE_MODES, ASSISTANT_MODES = tuple(MODES)[:4], tuple(MODES)[4:]


@dataclass(frozen=True)
class Run:
    """One generation: output and cost."""

    mode: str
    text: str
    new_tokens: int
    seconds: float
    target_passes: int
    forced_appended: int
    value: object = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def run_mode(mode: str, task: Task, model, tokenizer, assistant=None, *, max_new_tokens: int = 96) -> Run:
    """Greedy generation of `task` in `mode` (heuristic schedule, 5 tokens) with `assisted.generate`."""
    needs_assistant, constrained, coalesce, lookup = MODES[mode]
    if needs_assistant and assistant is None:
        raise ValueError(f"mode {mode!r} needs an assistant model")
    start = time.perf_counter()
    out = generate(model, assistant if needs_assistant else None, tokenizer=tokenizer,
                   messages=task.messages(constrained), schema=task.schema if constrained else None,
                   max_new_tokens=max_new_tokens, coalesce=coalesce, num_assistant_tokens=5,
                   num_assistant_tokens_schedule="heuristic", prompt_lookup=lookup)
    seconds, s = time.perf_counter() - start, out.stats
    return Run(mode, out.text, s.new_tokens, seconds, s.target_forward_passes, s.forced_tokens_appended, out.value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser("demo", __doc__)
    parser.add_argument("--assistant", action="store_true",
                        help=f"use the Qwen pair ({PAIR[0]} + {PAIR[1]}) and add the assistant modes")
    parser.add_argument("--max-new-tokens", type=int, default=80, help="token budget per generation")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (0: torch's default). 1 is the default because on the shared "
                             "2-core CPU 1 thread ran SmolLM2 ~4x faster than 2 (0.20 vs 0.83 s/token measured)")
    return parser.parse_args(argv)


def table(task: Task, runs: list[Run]) -> str:
    """A fixed-width table of the runs of one task."""
    base = next(r for r in runs if r.mode == "constrained").seconds
    head = (f"{'mode':<26} {'valid':>5} {'tokens':>6} {'wall s':>7} {'target fwd':>10} {'forced':>6} {'tok/s':>6} "
            f"{'speedup':>7}")
    lines = [head, "-" * len(head)]
    for r in runs:
        ok = validate(task, extract_json(r.text))
        lines.append(f"{r.mode:<26} {'yes' if ok else 'no':>5} {r.new_tokens:>6} {r.seconds:>7.2f} "
                     f"{r.target_passes:>10} {r.forced_appended:>6} {r.tokens_per_s:>6.1f} {base / r.seconds:>6.2f}x")
    return "\n".join(lines)


def run_task(task: Task, model, tokenizer, helper, modes, max_new_tokens: int) -> list[Run]:
    run_mode("constrained", task, model, tokenizer, max_new_tokens=4)  # compile the schema's index once
    return [run_mode(m, task, model, tokenizer, helper, max_new_tokens=max_new_tokens) for m in modes]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.set_threads(args)
    start = time.perf_counter()
    model, tokenizer, helper = cli.load(argparse.Namespace(target=PAIR[0] if args.assistant else SMALL,
                                                           assistant=PAIR[1] if args.assistant else None))
    names = f"{PAIR[0]} + assistant {PAIR[1]}" if args.assistant else SMALL
    print(f"models: {names} (loaded in {time.perf_counter() - start:.1f} s); greedy, max {args.max_new_tokens} new "
          "tokens")
    modes = BASE_MODES + (ASSISTANT_MODES if args.assistant else ())
    start = time.perf_counter()
    for task in DEMO:
        runs = run_task(task, model, tokenizer, helper, modes, args.max_new_tokens)
        best = next(r for r in runs if r.mode == ("full" if args.assistant else "constrained+forced"))
        print(f"\n== {task.name} ({task.kind}) ==\nprompt: {task.user}\n")
        print(f"validated ({best.mode}): {best.value!r}\nJSON: {best.text}\n")
        print(table(task, runs))
    print(f"\nspeedup = wall time of plain constrained / wall time of the mode. "
          f"Generation took {time.perf_counter() - start:.1f} s after the model load.")
    print("The schema's token index is compiled before timing; masks are computed lazily on first visit of a state.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

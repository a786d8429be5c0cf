"""How much of generate()'s wall time is the loop itself, and how few target forwards Character needs.

    python -m experiments.loop_overhead                  # SmolLM2-135M on this machine's CPU
    python -m experiments.loop_overhead --threads 1 --repeats 5 --json overhead.json

1. Loop overhead: for SmolLM2-135M (greedy) in five modes, the share of wall time spent outside the
   target's and the assistant's forward passes (masks, guide, acceptance, cache crops, bookkeeping),
   from `out.stats.seconds` (overhead = total - target - assistant). Goal: under 5%. Each mode runs
   once to warm the guide's per-state caches, then `--repeats` times; the median run is reported.
2. The seed's Character example with coalesce=True: target forward passes for the whole object with
   no assistant, with a 2-layer truncated copy as (weak) assistant, and with the target drafting for
   itself (an ideal assistant). Goal: at most 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from assisted import generate  # noqa: E402
from experiments.models import truncated  # noqa: E402

PROSE = [{"role": "user", "content": "Write a short paragraph about the history of Paris."}]


def modes(character, weak, model):
    """name -> (assistant, generate kwargs)."""
    schema = dict(messages=character.messages(), schema=character.schema)
    return {
        "plain (reference)": (None, dict(messages=PROSE, coalesce=False)),
        "constrained": (None, dict(**schema, coalesce=False)),
        "constrained+forced": (None, dict(**schema, coalesce=True)),
        "constrained+weak assistant": (weak, dict(**schema, coalesce=False)),
        "full (self-drafting)": (model, dict(**schema, coalesce=True)),
    }


def overhead_row(name, model, tokenizer, assistant, kwargs, repeats, max_new_tokens):
    """Median-of-`repeats` timings of one mode after a warm-up run."""
    run = lambda: generate(model, assistant, tokenizer=tokenizer, max_new_tokens=max_new_tokens, **kwargs)  # noqa: E731
    cold = run().stats
    outs = sorted((run().stats for _ in range(repeats)), key=lambda s: s.seconds.total)
    s = outs[len(outs) // 2]
    t = s.seconds
    return {
        "mode": name, "new_tokens": s.new_tokens, "target_passes": s.target_forward_passes,
        "assistant_passes": s.assistant_forward_passes, "total_s": t.total, "target_s": t.target,
        "assistant_s": t.assistant, "fsm_s": t.fsm, "overhead_s": t.overhead,
        "overhead_share": t.overhead / t.total, "cold_overhead_share": cold.seconds.overhead / cold.seconds.total,
        "ms_overhead_per_step": 1e3 * t.overhead / max(1, len(s.steps)),
    }


def character_row(name, model, tokenizer, assistant, character, max_new_tokens):
    out = generate(model, assistant, tokenizer=tokenizer, messages=character.messages(), schema=character.schema,
                   max_new_tokens=max_new_tokens, coalesce=True)
    s = out.stats
    return {"assistant": name, "text": out.text, "valid": out.value is not None, "stop": out.stop_reason,
            "new_tokens": s.new_tokens, "target_passes": s.target_forward_passes,
            "forced_appended": s.forced_tokens_appended, "assistant_passes": s.assistant_forward_passes}


def print_tables(overhead, character, threads):
    print(f"\nLoop overhead, SmolLM2-135M greedy, {threads} torch thread(s) (median run; goal < 5%)")
    head = f"{'mode':<28} {'tokens':>6} {'target fwd':>10} {'total s':>8} {'target s':>8} {'asst s':>7} " \
           f"{'fsm s':>6} {'overhead':>8} {'cold':>6} {'ms/step':>7}"
    print(head + "\n" + "-" * len(head))
    for r in overhead:
        print(f"{r['mode']:<28} {r['new_tokens']:>6} {r['target_passes']:>10} {r['total_s']:>8.2f} "
              f"{r['target_s']:>8.2f} {r['assistant_s']:>7.2f} {r['fsm_s']:>6.3f} {r['overhead_share']:>7.1%} "
              f"{r['cold_overhead_share']:>6.1%} {r['ms_overhead_per_step']:>7.2f}")
    print("\nCharacter example, coalesce=True: target forward passes for the whole object (goal <= 3)")
    for r in character:
        print(f"  {r['assistant']:<30} passes={r['target_passes']:<3} tokens={r['new_tokens']:<3} "
              f"forced appended={r['forced_appended']:<3} valid={r['valid']}  {r['text']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.loop_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (median reported)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from experiments.models import load
    from experiments.tasks import CHARACTER

    model, tokenizer = load("smollm2-135m")
    weak = truncated(model, 2)
    overhead = [overhead_row(name, model, tokenizer, assistant, kw, args.repeats, args.max_new_tokens)
                for name, (assistant, kw) in modes(CHARACTER, weak, model).items()]
    character = [character_row(name, model, tokenizer, assistant, CHARACTER, args.max_new_tokens)
                 for name, assistant in (("none", None), ("weak (2-layer truncated copy)", weak),
                                         ("ideal (the target itself)", model))]
    print_tables(overhead, character, args.threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "overhead": overhead, "character": character}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much held-out text a draft vocabulary covers, by ranking: token ids' order against frequency counts.

    python -m experiments.draft_vocab_coverage --tokenizer qwen2.5-coder-0.5b

A draft vocabulary of K tokens (`assisted.models.draft_vocab`) loses a greedy draft the full assistant would have
had accepted only where the target's token lies outside it, so the share of held-out tokens outside bounds the
acceptance it costs. Held-out text: compact JSON of JSONSchemaBench schemas (half of --files, shuffled with seed 0;
the other half is the held-in corpus of the frequency rankings) and the project's drafting/ and experiments/ Python;
the "json+code+docs" ranking also counts assisted/ and fsm/ Python and the docs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    from assisted.models.draft_vocab import draft_ids, frequency_ranking
    from assisted.models.loading import load_tokenizer
    p = argparse.ArgumentParser(prog="python -m experiments.draft_vocab_coverage", description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", default="qwen2.5-coder-0.5b")
    p.add_argument("--schemas", default="/work/shared/data/jsonschemabench")
    p.add_argument("--files", type=int, default=1200)
    p.add_argument("--sizes", type=int, nargs="+", default=[16384, 32768])
    args = p.parse_args(argv)
    tok = load_tokenizer(args.tokenizer)
    files = sorted(glob.glob(f"{args.schemas}/*.json"))
    random.Random(0).shuffle(files)
    texts = [json.dumps(json.load(open(f)), separators=(",", ":")) for f in files[: args.files]]
    held_in, held_out = texts[: len(texts) // 2], texts[len(texts) // 2 :]
    read = [open(path).read() for path in glob.glob("assisted/**/*.py", recursive=True)
            + glob.glob("fsm/**/*.py", recursive=True) + glob.glob("docs/*.md") + ["README.md"]]
    code_out = [open(path).read() for path in glob.glob("drafting/*.py") + glob.glob("experiments/*.py")]
    spelled = {name: [i for t in ts for i in tok(t, add_special_tokens=False)["input_ids"]]
               for name, ts in (("json", held_out), ("code", code_out))}
    rankings = {"id order": [], "json freq": frequency_ranking(tok, held_in),
                "json+code+docs freq": frequency_ranking(tok, held_in + read)}
    vocab = len(tok)
    print(f"| ranking | K | held-out JSON covered ({len(spelled['json'])} tokens) | held-out Python covered "
          f"({len(spelled['code'])} tokens) |\n|---|---|---|---|")
    for name, ranking in rankings.items():
        for k in args.sizes:
            ids = set(draft_ids(vocab, k, ranking, tok.all_special_ids).tolist())
            cover = {n: sum(i in ids for i in s) / len(s) for n, s in spelled.items()}
            print(f"| {name} | {k} | {cover['json']:.4f} | {cover['code']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""First-walk mask speed: a guide's masks along the tokens of a valid instance of each JSONSchemaBench schema, new
guide per schema (all first visits), the trie walk against the column walk interleaved schema by schema.

    python -m experiments.mask_speed --tokenizer /path/to/tokenizer_folder [--schemas 40] [--policy compact]

Reports per system the mask time per position (p50/p90/max), the advance time, the whole walk, and whether the
masks were bitwise the same. One thread; timings on a shared machine are noisy: compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from assisted.models.loading import freeze_loaded_objects
from fsm.caches import clear_caches

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench"


def load_tokenizer(source: str):
    if source == "smollm2-135m":
        from experiments.models import load_tokenizer as named
        return named(source)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(source)


def cases(count: int, seed: int) -> list[tuple[str, dict, object]]:
    """(name, schema, first valid instance) of `count` schemas drawn at random (those with a valid instance)."""
    files = sorted(DATA.iterdir())
    random.Random(seed).shuffle(files)
    out = []
    for path in files:
        case = json.loads(path.read_text())
        valid = [t["data"] for t in case.get("tests", []) if t.get("valid")]
        if valid:
            out.append((path.name, case["schema"], valid[0]))
        if len(out) == count:
            break
    return out


def walk(schema, instance, tokenizer, trie: bool, policy: str):
    """(mask seconds per position, advance seconds, masks) of a fresh guide over the instance; None if refused."""
    import fsm
    from fsm import index

    clear_caches()
    index.TRIE_WALK = trie
    try:
        guide = fsm.Guide.from_schema(schema, tokenizer, policy=policy)
    except Exception:  # refused or over budget: not walked
        return None
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    masks, times, advance = [], [], 0.0
    try:
        for token in ids:
            start = time.perf_counter()
            mask = guide.mask()
            times.append(time.perf_counter() - start)
            masks.append(np.packbits(mask.numpy()).tobytes())
            start = time.perf_counter()
            guide.advance(token)
            advance += time.perf_counter() - start
    except fsm.InvalidTokenError:
        pass  # the instance leaves the compact language (key order, spelling): walked as far as it goes
    return times, advance, masks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder, or smollm2-135m")
    p.add_argument("--schemas", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="compact")
    args = p.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    freeze_loaded_objects()  # as load_pair does: no full collection over torch's objects inside a timed walk
    from fsm.vocabulary import vocabulary_from_tokenizer
    start = time.perf_counter()
    vocabulary = vocabulary_from_tokenizer(tokenizer)
    vocabulary.walk_layout.trie
    print(f"tokenizer set-up (vocabulary, layout, trie): {time.perf_counter() - start:.3f} s")
    results = {"trie": ([], [], 0.0), "column": ([], [], 0.0)}
    differ = walked = 0
    for name, schema, instance in cases(args.schemas, args.seed):
        order = ("trie", "column") if walked % 2 == 0 else ("column", "trie")  # interleaved, alternating first
        got = {system: walk(schema, instance, tokenizer, system == "trie", args.policy) for system in order}
        if got["trie"] is None or got["column"] is None:
            continue
        walked += 1
        if got["trie"][2] != got["column"][2]:
            differ += 1
            print(f"masks differ: {name}")
        for system, (times, advance, _) in got.items():
            masks, walks, adv = results[system]
            masks.extend(times)
            walks.append(sum(times) + advance)
            results[system] = (masks, walks, adv + advance)
    print(f"{walked} schemas walked, masks differ in {differ}")
    for system, (masks, walks, adv) in results.items():
        a = np.asarray(masks) * 1e3
        print(f"{system:7s} masks {len(a)}: p50 {np.percentile(a, 50):.3f} ms p90 {np.percentile(a, 90):.3f} ms "
              f"max {a.max():.1f} ms; whole walk p50 {np.percentile(walks, 50):.3f} s max {max(walks):.2f} s "
              f"sum {sum(walks):.2f} s; advance sum {adv:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

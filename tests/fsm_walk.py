"""Random walks through guides: the property tests' way of sampling what a guide lets through."""

from __future__ import annotations

import random

import numpy as np

from fsm import Guide, InvalidTokenError
from fsm.regex import DEAD


def distances_to_accept(dfa) -> np.ndarray:
    """Fewest bytes from each DFA state to an accepting state (expands the whole lazy DFA: what the root
    reaches, and the states a token index numbered apart from it, see fsm.index.HeadWalk)."""
    dfa.explore_all()
    filled = 0
    while filled < dfa.n_states:
        dfa.row(filled)
        filled += 1
    dist = np.where(dfa.accepting, 0, np.iinfo(np.int32).max).astype(np.int64)
    while True:
        targets = dfa.transitions
        via = np.where(targets != DEAD, dist[targets] + 1, np.iinfo(np.int32).max).min(axis=1)
        new = np.minimum(dist, via)
        if (new == dist).all():
            return dist
        dist = new


def random_walk(guide: Guide, rng: random.Random, budget: int = 40, stop_chance: float = 0.3) -> list[int]:
    """Token ids from a walk over allowed tokens that ends at EOS.

    Random for `budget` steps, then it heads for acceptance along the shortest byte distance (`Closing.byte_distance`,
    per state reached: the DFA of a recursive schema has no end to explore).
    Every step checks the guide's invariants: something is allowed and EOS only where final.
    """
    distance = guide.index.closing.byte_distance
    eos = np.asarray(guide.eos_token_ids)
    tokens: list[int] = []
    while not guide.is_finished():
        info = guide.index.info(guide.state)
        is_eos = np.isin(info.token_ids, eos)
        assert len(info.token_ids), f"dead end after {tokens}"
        assert is_eos.any() == guide.is_final()
        only_eos = is_eos.all()
        if guide.is_final() and (only_eos or len(tokens) >= budget or rng.random() < stop_chance):
            choice = int(info.token_ids[is_eos][0])
        else:
            candidates = info.token_ids[~is_eos]
            if len(tokens) >= budget:  # head home: only tokens that get closest to acceptance
                states, inverse = np.unique(info.next_states[~is_eos], return_inverse=True)
                d = np.asarray([distance(s) for s in states.tolist()])[inverse]
                candidates = candidates[d == d.min()]
            choice = int(candidates[rng.randrange(len(candidates))])
        guide.advance(choice)
        tokens.append(choice)
    return tokens


def text_of(guide: Guide, tokens: list[int]) -> str:
    token_bytes = guide.index.vocabulary.token_bytes
    eos = set(guide.eos_token_ids)
    return b"".join(token_bytes[t] for t in tokens if t not in eos).decode("utf-8")


def accepts_text(guide: Guide, text: str, tokenizer) -> bool:
    """Whether `guide` walks the tokenizer's own tokens of `text` to a final state (advancing `guide`)."""
    try:
        for token in tokenizer.encode(text, add_special_tokens=False):
            guide.advance(token)
    except InvalidTokenError:
        return False
    return guide.is_final()

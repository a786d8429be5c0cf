"""An assistant with another tokenizer: it drafts text, and the text is spelled in the target's tokens.

The assistant keeps its own tokens, KV cache and guide (compiled for its tokenizer from the call's schema or regex,
so its drafts stay valid text). Whenever it is asked for the target token after a target context (the committed
sequence and the draft so far, forced and copied tokens included), it first keeps in step by text: its tokens inside
the longest common text prefix with the context stay, with their cache entries; the rest of the context's text is
spelled in its tokens and fed on its next forward. It then drafts its argmax tokens (its guide's forced runs without
a forward) until the text it wrote past the context spells at least one settled target token
(`drafting.respell`): the target's canonical tokens of that text, its last word held back while the text may go on.

Each target token it hands out is a point mass (`Drafted.q` None): the target accepts it with probability p(x) and
otherwise draws from p with x removed, which gives exactly p conditional on any x, so sampling stays exact whatever
the assistant wrote, and greedy output is the target's argmax chain (docs/design.md, "A draft from another tokenizer
is text"). Under point-mass acceptance the best draft is the assistant's argmax, so it drafts greedily whatever the
target samples with. Target tokens its spelling predicts beyond the one asked for are kept (`expected`) and handed
out while the contexts follow them, without the tokenizer. It needs nothing after a step: the next `draft` keeps in
step with whatever the target committed. Each row of the engine has its own (`draft_foreign`).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right

import fsm
from drafting.assistant import pick, settle
from drafting.base import Cursor, DeviceMasks, Drafted
from drafting.draft_head import use_full_head
from drafting.kv_cache import DynamicKV, input_device
from drafting.respell import Speller, char_start, common_prefix, whole_chars
from drafting.sampling import Warp

GREEDY = Warp()  # point masses are accepted with p(x): the assistant's best guess at argmax p is its own argmax
MAX_AHEAD = 8  # assistant tokens drafted at most for one settled target token (a long word)


class ForeignDrafter:
    """Drafts target tokens, one at a time, from an assistant with its own tokenizer and guide.

    Parameters
    ----------
    model : transformers causal LM
        The assistant.
    prompt : list of int
        The assistant's prompt in its own tokens.
    cursor : Cursor
        The assistant's guide at the start of the output (unconstrained: a cursor without a guide).
    target, own : Speller
        Spellers of the target's and the assistant's vocabularies.
    start : int
        The target's prompt length: where its output starts in the contexts `draft` is shown.
    eos : frozenset of int
        The assistant's EOS ids: its draft ends there (so does a token without text).
    max_positions : int, optional
        The assistant's position limit: it drafts nothing past it.
    """

    def __init__(self, model, prompt: list[int], cursor: Cursor, target: Speller, own: Speller, start: int,
                 eos: frozenset[int], max_positions: int | None = None):
        self.model, self.prompt, self.start, self.eos = model, list(prompt), start, eos
        self.max_positions = max_positions
        self.target, self.own = target, own
        self.kv, self.cached = DynamicKV(model), 0  # the cache holds (prompt + out)[:cached]
        self.device = input_device(model)
        self.masks = DeviceMasks(self.device)
        self.out, self.ends, self.conf = [], [], []  # its output tokens, their byte ends in `data`, confidences (NaN:
        # fed or forced)
        self.data = bytearray()  # the output's bytes
        self.cursors = [cursor]  # its guide before each output token, and after the last
        self.done = False  # it ended its text (EOS) at the end of `data`
        self.seen_ids, self.seen_ends, self.seen = [], [], bytearray()  # the target output it was last shown
        self.expected, self.expected_conf = [], []  # target output its last spelling predicts, with confidences
        self.calls, self.asked, self.drafted = 0, 0, 0  # its forward passes; target tokens asked for, handed out
        self.seconds, self.tokenizer_seconds = 0.0, 0.0  # all its work (forwards, tokenizer calls); tokenizer calls

    def draft(self, context: list[int], mask) -> Drafted | None:
        """The target token after `context` (target ids: prompt, committed output, draft so far) as a point mass, or
        None when the assistant has none there or the target's guide `mask` (V,) forbids it."""
        begin, self.asked = time.perf_counter(), self.asked + 1
        try:
            found = self._next(context[self.start:])
        finally:
            self.seconds += time.perf_counter() - begin
        if found is None or (mask is not None and not bool(mask[found[0]])):
            return None
        self.drafted += 1
        return Drafted(found[0], None, found[1], None)

    def _next(self, output: list[int]) -> tuple[int, float] | None:
        n = len(output)
        if n < len(self.expected) and self.expected[:n] == output:
            return self.expected[n], self.expected_conf[n]
        self._see(output)
        if not self._sync():
            return None
        ids, conf = self._draft_ahead()
        self.expected, self.expected_conf = output + ids, [math.nan] * n + conf
        return (ids[0], conf[0]) if ids else None

    def _see(self, output: list[int]) -> None:
        """Take the target's output text (`seen`) from its ids, reusing the common prefix with the last one."""
        keep = common_prefix(self.seen_ids, output)
        del self.seen_ids[keep:], self.seen_ends[keep:]
        del self.seen[self.seen_ends[-1] if keep else 0:]
        for token in output[keep:]:
            self.seen += self.target.token_bytes[token]
            self.seen_ids.append(token)
            self.seen_ends.append(len(self.seen))

    def _sync(self) -> bool:
        """Keep the assistant's tokens inside the common text with `seen` and feed it the rest of `seen` (False when
        its tokenizer or guide cannot take that text)."""
        same = common_prefix(self.data, self.seen)
        if same == len(self.seen):  # at or ahead of the target's text: everything it drafted still stands
            return True
        keep = bisect_right(self.ends, same)
        while keep and char_start(self.seen, self.ends[keep - 1]) != self.ends[keep - 1]:
            keep -= 1  # the rest starts on a character, so that it is spelled as text
        self._truncate(keep)
        return self._feed(bytes(self.seen[len(self.data):]))

    def _truncate(self, keep: int) -> None:
        del self.out[keep:], self.ends[keep:], self.conf[keep:], self.cursors[keep + 1:]
        del self.data[self.ends[-1] if keep else 0:]
        self.done = False
        self.cached = min(self.cached, len(self.prompt) + keep)
        self.kv.crop(self.cached)

    def _feed(self, text: bytes) -> bool:
        spelling = self._spell(self.own, text)
        if spelling is None:
            return False
        keep = len(self.out)
        try:
            for token in spelling.ids:
                self._append(token, math.nan)
        except fsm.InvalidTokenError:  # its guide refuses its spelling of valid text: it sits this step out
            self._truncate(keep)
            return False
        return True

    def _append(self, token: int, confidence: float) -> None:
        cursor = self.cursors[-1].copy()
        cursor.advance(token)
        self.cursors.append(cursor)
        self.out.append(token)
        self.conf.append(confidence)
        self.data += self.own.token_bytes[token]
        self.ends.append(len(self.data))

    def _draft_ahead(self) -> tuple[list[int], list[float]]:
        """Settled target tokens of the text past `seen`, drafting assistant tokens until there is one."""
        found, steps = self._settled(), 0
        while not found[0] and not self.done and steps < MAX_AHEAD and self._step():
            found, steps = self._settled(), steps + 1
        return found

    def _step(self) -> bool:
        """Append the guide's forced run, or one argmax token (one forward); False when the assistant cannot go on."""
        cursor = self.cursors[-1]
        forced = cursor.forced()
        if forced:
            for token in forced:
                self._append(token, math.nan)
            return True
        if cursor.only_eos_left():
            self.done = True
            return False
        if self.max_positions is not None and len(self.prompt) + len(self.out) >= self.max_positions:
            return False
        mask = cursor.mask()
        use_full_head(self.model, [mask])  # a draft vocabulary's exceptions
        logits = self.kv.run(self._uncached(), 1)  # (1, V)
        self.cached = len(self.prompt) + len(self.out)
        drafted = settle([pick(logits, self.masks(mask), GREEDY, None)])[0]
        self.calls += 1
        if drafted.token in self.eos or not self.own.token_bytes[drafted.token]:
            self.done = True
            return False
        self._append(drafted.token, drafted.confidence)
        return True

    def _uncached(self) -> list[int]:
        held = len(self.prompt)
        return self.prompt[self.cached:] + self.out if self.cached < held else self.out[self.cached - held:]

    def _settled(self) -> tuple[list[int], list[float]]:
        """The target tokens of the assistant's text past `seen` that more text cannot change (all once it ended)."""
        base = len(self.seen)
        ahead = bytes(self.data[base:])
        ahead = ahead if self.done else ahead[:whole_chars(ahead)]
        spelling = self._spell(self.target, ahead) if ahead else None
        if spelling is None:
            return [], []
        ids = list(spelling.ids if self.done else spelling.ids[:spelling.settled])
        return ids, self._confidences(base, ids)

    def _confidences(self, at: int, ids: list[int]) -> list[float]:
        """Per target token from byte `at` on: the product of the assistant's confidences in the tokens that wrote
        its bytes (forced and fed ones count 1)."""
        found = []
        for token in ids:
            end = at + len(self.target.token_bytes[token])
            first, last = bisect_right(self.ends, at), bisect_left(self.ends, end)
            found.append(math.prod(c for c in self.conf[first:last + 1] if not math.isnan(c)))
            at = end
        return found

    def _spell(self, speller: Speller, data: bytes):
        begin = time.perf_counter()
        try:
            return speller.spell(data)
        finally:
            self.tokenizer_seconds += time.perf_counter() - begin


def draft_foreign(proposals: list, drafters: list) -> list[tuple[int, float, float]]:
    """Complete each `Proposal`: forced runs and copies, and where its row has a `ForeignDrafter` (None: none), every
    assistant token it asks for. Per row: (the drafter's forwards, its seconds, its tokenizer seconds) this took."""
    spent = []
    for proposal, drafter in zip(proposals, drafters):
        before = (0, 0.0, 0.0) if drafter is None else (drafter.calls, drafter.seconds, drafter.tokenizer_seconds)
        while proposal.fill() and drafter is not None:
            proposal.give(drafter.draft(proposal.context, proposal.mask))
        after = (0, 0.0, 0.0) if drafter is None else (drafter.calls, drafter.seconds, drafter.tokenizer_seconds)
        spent.append(tuple(a - b for a, b in zip(after, before)))
    return spent

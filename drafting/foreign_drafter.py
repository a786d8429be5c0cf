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
out while the contexts follow them, without the tokenizer. It needs nothing after a step: the next `ask` keeps in
step with whatever the target committed.

It runs no model itself: `ask` does the host work (respelling, forced runs) up to where it needs the assistant's next
token, and `take` resumes with it. Each row of the engine has its own drafter, and `ForeignAsker` puts it in the
engine's drafting rounds (`drafting.assistant.Assistant.rounds`): the rows that need a token at once get it from one
batched assistant forward, on the row's entries of the engine's assistant cache.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right

import torch

import fsm
from drafting.assistant import Pick, pick
from drafting.base import Cursor, DeviceMasks, Drafted
from drafting.proposal import Proposal
from drafting.respell import Speller, char_start, common_prefix, whole_chars
from drafting.sampling import Warp

GREEDY = Warp()  # point masses are accepted with p(x): the assistant's best guess at argmax p is its own argmax
MAX_AHEAD = 8  # assistant tokens drafted at most for one settled target token (a long word)


class ForeignDrafter:
    """Drafts target tokens, one at a time, from an assistant with its own tokenizer and guide.

    Asked for the target token after a context (`ask`), it answers (`answer`) or first needs the assistant's argmax
    after its own tokens (`waiting`: feed its cache `feed(cached)`, pick under `mask`, hand the token to `take`).

    Parameters
    ----------
    prompt : list of int
        The assistant's prompt in its own tokens.
    cursor : Cursor
        The assistant's guide at the start of the output (unconstrained: a cursor without a guide).
    target, own : Speller
        Spellers of the target's and the assistant's vocabularies.
    start : int
        The target's prompt length: where its output starts in the contexts `ask` is shown.
    eos : frozenset of int
        The assistant's EOS ids: its draft ends there (so does a token without text).
    max_positions : int, optional
        The assistant's position limit: it drafts nothing past it.
    """

    def __init__(self, prompt: list[int], cursor: Cursor, target: Speller, own: Speller, start: int,
                 eos: frozenset[int], max_positions: int | None = None):
        self.prompt, self.start, self.eos = list(prompt), start, eos
        self.max_positions = max_positions
        self.target, self.own = target, own
        self.valid = len(self.prompt)  # its cache entries of (prompt + out)[:valid] still hold (it may hold fewer)
        self.out, self.ends, self.conf = [], [], []  # its output tokens, their byte ends in `data`, confidences (NaN:
        # fed or forced)
        self.data = bytearray()  # the output's bytes
        self.cursors = [cursor]  # its guide before each output token, and after the last
        self.done = False  # it ended its text (EOS) at the end of `data`
        self.seen_ids, self.seen_ends, self.seen = [], [], bytearray()  # the target output it was last shown
        self.expected, self.expected_conf = [], []  # target output its last spelling predicts, with confidences
        self.waiting, self.answer = False, None  # it needs a token of the assistant; else its answer (Drafted|None)
        self.output, self.target_mask, self.steps = [], None, 0  # the output and mask asked about, tokens drafted
        self.calls, self.asked, self.drafted = 0, 0, 0  # assistant tokens it took; target tokens asked for, handed out
        self.seconds, self.tokenizer_seconds = 0.0, 0.0  # all its own work (host only); its tokenizer calls

    @property
    def tokens(self) -> list[int]:
        """Its context in its own ids: prompt and output."""
        return self.prompt + self.out

    @property
    def mask(self) -> torch.Tensor | None:
        """(V_assistant,) its guide's mask at its next token (while `waiting`)."""
        return self.cursors[-1].mask()

    def feed(self, cached: int) -> list[int]:
        """Its ids after the first `cached` (a prefix of what its cache was fed: at most `valid`)."""
        held = len(self.prompt)
        return self.prompt[cached:] + self.out if cached < held else self.out[cached - held:]

    def ask(self, context: list[int], mask) -> bool:
        """Start on the target token after `context` (target ids: prompt, committed output, draft so far), which the
        target's guide `mask` (V,) must allow; True while `waiting` for an assistant token, else `answer` is a point
        mass or None (the assistant has no token there, or the mask forbids it)."""
        begin, self.asked = time.perf_counter(), self.asked + 1
        try:
            output = context[self.start:]
            self.target_mask, n = mask, len(output)
            if n < len(self.expected) and self.expected[:n] == output:
                return self._answer(self.expected[n], self.expected_conf[n])
            self._see(output)
            if not self._sync():
                return self._answer(None, None)
            self.output, self.steps = output, 0
            return self._ahead()
        finally:
            self.seconds += time.perf_counter() - begin

    def take(self, drafted: Drafted) -> bool:
        """The assistant's argmax after `feed` (its cache now holds all its tokens): draft on, as `ask`."""
        begin = time.perf_counter()
        try:
            self.valid, self.waiting = len(self.prompt) + len(self.out), False
            self.calls, self.steps = self.calls + 1, self.steps + 1
            if drafted.token in self.eos or not self.own.token_bytes[drafted.token]:
                self.done = True
            else:
                self._append(drafted.token, drafted.confidence)
            return self._ahead()
        finally:
            self.seconds += time.perf_counter() - begin

    def _ahead(self) -> bool:
        """Draft forced runs until the text past `seen` spells a settled target token; True where that needs an
        assistant token first (`waiting`), else answer the first settled token (or None)."""
        while True:
            ids, conf = self._settled()
            if ids or self.done or self.steps >= MAX_AHEAD:
                break
            cursor = self.cursors[-1]
            forced = cursor.forced()
            if forced:
                for token in forced:
                    self._append(token, math.nan)
                self.steps += 1
            elif cursor.only_eos_left():
                self.done = True
            elif self.max_positions is not None and len(self.prompt) + len(self.out) >= self.max_positions:
                break
            else:
                self.waiting = True
                return True
        self.expected, self.expected_conf = self.output + ids, [math.nan] * len(self.output) + conf
        return self._answer(ids[0], conf[0]) if ids else self._answer(None, None)

    def _answer(self, token: int | None, confidence: float | None) -> bool:
        """Set `answer` (None where the target's guide forbids `token`); False: not waiting."""
        if token is None or (self.target_mask is not None and not bool(self.target_mask[token])):
            self.answer = None
        else:
            self.answer, self.drafted = Drafted(token, None, confidence, None), self.drafted + 1
        return False

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
        self.valid = min(self.valid, len(self.prompt) + keep)

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


class ForeignAsker:
    """A row drafted by its `ForeignDrafter` in the engine's drafting rounds (`drafting.assistant.Asker`): its
    `Proposal` asks for target tokens, the drafter answers them, asking the round for assistant tokens where it must
    (its argmax under its own guide's mask: point-mass drafts are best at the assistant's best guess)."""

    processors = None  # the target's processors do not apply to the assistant's vocabulary

    def __init__(self, proposal: Proposal, drafter: ForeignDrafter):
        self.proposal, self.drafter = proposal, drafter
        self.before = drafter.seconds, drafter.tokenizer_seconds
        self.mask = None  # (V_assistant,) while the drafter waits

    @property
    def seconds(self) -> float:
        return self.drafter.seconds - self.before[0]

    @property
    def respelling(self) -> float:
        return self.drafter.tokenizer_seconds - self.before[1]

    def asks(self) -> bool:
        drafter = self.drafter
        while not drafter.waiting:
            if not self.proposal.fill():
                return False
            if not drafter.ask(self.proposal.context, self.proposal.mask):
                self.proposal.give(drafter.answer)
        self.mask = drafter.mask
        return True

    def kept(self, cached: int) -> int:
        return min(cached, self.drafter.valid)

    def feed(self, cached: int) -> list[int]:
        return self.drafter.feed(cached)

    def pick(self, logits: torch.Tensor, masks: DeviceMasks) -> Pick:
        return pick(logits, masks(self.mask), GREEDY, None)

    def give(self, drafted: Drafted) -> None:
        if not self.drafter.take(drafted):
            self.proposal.give(self.drafter.answer)

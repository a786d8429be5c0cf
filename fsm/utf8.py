"""Code point ranges -> UTF-8 byte terms (surrogates excluded: they are not valid UTF-8)."""

from __future__ import annotations

from fsm import rx

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
_UTF8_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF)

ByteRanges = tuple[tuple[int, int], ...]  # one (low, high) range per byte of a UTF-8 sequence


def chars(ranges) -> rx.Rx:
    """One character whose code point lies in one of the (low, high) `ranges` (inclusive)."""
    options = []
    for low, high in without_surrogates(merge(sorted(ranges))):
        for seq in utf8_sequences(low, high):
            options.append(rx.seq(*(rx.byte_range(lo, hi) for lo, hi in seq)))
    return rx.alt(*options)


def chars_except(ranges) -> rx.Rx:
    """One character whose code point is in none of `ranges`."""
    return chars(complement(merge(sorted(ranges))))


def merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ranges -> sorted, disjoint, non-adjacent ranges."""
    out: list[list[int]] = []
    for lo, hi in ranges:
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The code points outside sorted disjoint `ranges`."""
    gaps, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            gaps.append((start, lo - 1))
        start = max(start, hi + 1)
    if start <= MAX_CODE_POINT:
        gaps.append((start, MAX_CODE_POINT))
    return gaps


def without_surrogates(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        if lo < SURROGATES[0]:
            out.append((lo, min(hi, SURROGATES[0] - 1)))
        if hi > SURROGATES[1]:
            out.append((max(lo, SURROGATES[1] + 1), hi))
    return out


def utf8_sequences(low: int, high: int) -> list[ByteRanges]:
    """Split code points [low, high] into UTF-8 byte-range products (disjoint, exact)."""
    out, stack = [], [(low, high)]
    while stack:
        lo, hi = stack.pop()
        split = _split_point(lo, hi)
        if split is None:
            out.append(tuple(zip(chr(lo).encode(), chr(hi).encode())))
        else:
            stack += [(split + 1, hi), (lo, split)]
    return out


def _split_point(lo: int, hi: int) -> int | None:
    """Where [lo, hi] must be cut so that each part is a product of byte ranges (None: no cut)."""
    for limit in _UTF8_LENGTH_LIMITS:
        if lo <= limit < hi:
            return limit
    for shift in (6, 12, 18):
        mask = (1 << shift) - 1
        if lo >> shift != hi >> shift:
            if lo & mask:
                return lo | mask
            if hi & mask != mask:
                return (hi & ~mask) - 1
    return None


ANY_CHAR = chars([(0, MAX_CODE_POINT)])  # any valid UTF-8 character

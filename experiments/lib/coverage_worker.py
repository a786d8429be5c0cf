"""One MaskBench schema: compile it to a ready guide, walk its test instances, measure.

A schema's instances are written as compact JSON in their own property order (the project's default
whitespace policy), tokenized by the tokenizer itself and walked token by token through the guide.
A rejection is checked once more on the byte DFA, which tells a regex-level verdict (the language is
wrong) from a token-level one (the language is right, but this tokenization cannot be walked).
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

import numpy as np

import fsm
from fsm import rx
from fsm.regex import dfa_of
from experiments.lib.coverage_pool import current_rss_mb, peak_rss_mb

# Step times (µs) are kept as histograms: 0.1 µs .. 10 s, 40 bins per decade (quantiles to ~3%).
STEP_BINS = np.logspace(-1, 7, 321)
MAX_TEXT = 300  # characters of an instance kept in a failure record


def compact(value) -> str:
    """The project's default serialization: compact JSON, key order kept, UTF-8 as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_file(path: str | Path, tokenizer, report=lambda stage: None, second_opinion: bool = True,
               options: dict | None = None) -> dict:
    """`check_schema` on one MaskBench file ({"schema", "tests": [{"valid", "data"}, ...]})."""
    record = json.loads(Path(path).read_text())
    return check_schema(record["schema"], record.get("tests") or [], tokenizer, report, second_opinion, options)


def check_schema(schema, tests: list[dict], tokenizer, report=lambda stage: None, second_opinion: bool = True,
                 options: dict | None = None) -> dict:
    """Compile `schema` (with `fsm.compile_schema` `options`), walk `tests`; returns {"row", "failures", histograms}.

    With `second_opinion`, every false accept also says what `jsonschema` finds wrong with it.
    """
    start_rss = current_rss_mb()
    row = {"n_valid": sum(bool(t["valid"]) for t in tests), "n_invalid": sum(not t["valid"] for t in tests)}
    out = {"row": row, "failures": [], "hist_first": None, "hist_revisit": None}
    report("compile:regex")
    guide = _compile(schema, tokenizer, row, report, options or {})
    if guide is not None:
        report("walk")
        _walk_tests(guide, schema if second_opinion else None, tests, tokenizer, row, out)
    row["cpu_s"] = round(time.process_time(), 3)  # this forked child's CPU time: the whole task
    row["peak_rss_mb"] = round(peak_rss_mb(), 1)
    row["rss_growth_mb"] = round(max(0.0, peak_rss_mb() - start_rss), 1)
    return out


def _compile(schema, tokenizer, row: dict, report, options: dict):
    """Schema -> ready guide (first mask built), timing each stage; None when it fails."""
    times, cpu_start = [time.perf_counter()], time.process_time()
    try:
        term = fsm.compile_schema(schema, **options)  # the "regex" stage: schema -> rx term
        times.append(time.perf_counter())
        report("compile:dfa")
        dfa = dfa_of(term)  # lazy: rows are filled as the walk visits them
        times.append(time.perf_counter())
        report("compile:index")
        guide = fsm.Guide.from_rx(term, tokenizer)
        times.append(time.perf_counter())
        report("compile:first_mask")
        guide.mask()
        times.append(time.perf_counter())
        cpu_ms = (time.process_time() - cpu_start) * 1000
    except fsm.SchemaError as error:
        row.update(status="unsupported", keyword=error.keyword or "(none)", pointer=error.pointer,
                   message=str(error)[:300])
        return None
    except fsm.RegexError as error:
        row.update(status="unsupported", keyword="(regex)", pointer="", message=str(error)[:300])
        return None
    except Exception as error:  # a bug in fsm: keep type, message and where it was raised
        row.update(status="error", error_type=type(error).__name__, message=str(error)[:300], where=_where(error))
        return None
    stages = np.diff(times) * 1000
    row.update(status="compiled", compile_ms=round(times[-1] * 1000 - times[0] * 1000, 3),
               compile_cpu_ms=round(cpu_ms, 3), **{f"{name}_ms": round(ms, 3) for name, ms in
                                                  zip(("regex", "dfa", "index", "first_mask"), stages)},
               regex_chars=rx.size(term), dfa_states=dfa.n_states)
    return guide


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    inside = [f for f in frames if "/fsm/" in f.filename] or frames
    if not inside:
        return ""
    path = Path(inside[-1].filename)
    return f"{path.parent.name}/{path.name}:{inside[-1].lineno} {inside[-1].name}"


def _walk_tests(guide, schema, tests: list[dict], tokenizer, row: dict, out: dict) -> None:
    counts = dict.fromkeys(("valid_accepted", "false_rejects", "false_rejects_regex", "false_rejects_token",
                            "invalid_rejected", "false_accepts", "false_accepts_regex_only", "tokenization_mismatch",
                            "walk_errors", "tokens_valid", "forced_tokens"), 0)
    first, revisit = [], []
    accepted_valid, longest = [], 0.0
    ordered = sorted(enumerate(tests), key=lambda it: not it[1]["valid"])  # valid ones first: timings
    for number, test in ordered:
        text = compact(test["data"])
        ids = tokenizer.encode(text, add_special_tokens=False)
        spelled = b"".join(guide.index.vocabulary.token_bytes[i] for i in ids if i < guide.vocab_size)
        counts["tokenization_mismatch"] += spelled != text.encode()
        try:
            verdict = _walk(guide, ids, first if test["valid"] else None, revisit if test["valid"] else None)
        except Exception as error:
            counts["walk_errors"] += 1
            out["failures"].append(_failure(number, test, text, "walk_error", f"{type(error).__name__}: {error}"[:300]))
            continue
        if test["valid"]:
            longest = max(longest, verdict[2])
        regex_ok = guide.index.dfa.fullmatch(text.encode())
        _count(counts, out, number, test, text, ids, verdict, regex_ok, guide, schema)
        if test["valid"] and verdict[0]:
            accepted_valid.append(ids)
    for ids in accepted_valid:
        counts["tokens_valid"] += len(ids)
        counts["forced_tokens"] += _forced_count(guide, ids)
    row.update(counts)
    row["status"] = "covered" if _covered(row) else "not_covered"
    row.update(**_step_stats("first", first), **_step_stats("revisit", revisit))
    row["walk_max_ms"] = round(longest / 1000, 3) if any(t["valid"] for t in tests) else ""
    row["states_visited"] = len(getattr(guide.index, "_states", ()))
    out["hist_first"] = np.histogram(first, STEP_BINS)[0] if first else None
    out["hist_revisit"] = np.histogram(revisit, STEP_BINS)[0] if revisit else None


def _covered(row: dict) -> bool:
    return row["false_rejects"] == 0 and row["false_accepts"] == 0 and row["walk_errors"] == 0


def _walk(guide, ids: list[int], first: list | None, revisit: list | None) -> tuple[bool, int, float]:
    """(accepted?, tokens walked, µs spent in mask()+advance()). Times each step into first/revisit (µs)."""
    g = guide.copy()
    built = getattr(g.index, "_states", None)
    seen = set() if built is None else built
    spent = 0.0
    for position, token in enumerate(ids):
        state = g.state
        fresh = state not in seen
        start = time.perf_counter_ns()
        g.mask()
        try:
            g.advance(token)
        except fsm.InvalidTokenError:
            return False, position, spent
        elapsed = (time.perf_counter_ns() - start) / 1000
        spent += elapsed
        if first is not None:
            (first if fresh else revisit).append(elapsed)
        if built is None:
            seen.add(state)
    return g.is_final(), len(ids), spent


def _count(counts, out, number, test, text, ids, verdict, regex_ok, guide, schema) -> None:
    accepted, walked, _ = verdict
    if test["valid"] and accepted:
        counts["valid_accepted"] += 1
    elif test["valid"]:
        level = "token" if regex_ok else "regex"
        counts["false_rejects"] += 1
        counts[f"false_rejects_{level}"] += 1
        path, detail = _where_rejected(guide, text, ids, walked, regex_ok)
        out["failures"].append(_failure(number, test, text, f"false_reject_{level}", detail, path))
    elif accepted:
        counts["false_accepts"] += 1
        out["failures"].append(_failure(number, test, text, "false_accept", _jsonschema_verdict(schema, test["data"])))
    else:
        counts["invalid_rejected"] += 1
        if regex_ok:
            counts["false_accepts_regex_only"] += 1
            out["failures"].append(_failure(number, test, text, "false_accept_regex_only",
                                            _jsonschema_verdict(schema, test["data"])))


def _forced_count(guide, ids: list[int]) -> int:
    """Tokens of an accepted instance that equal the first forced token proposed at that point."""
    g, hits = guide.copy(), 0
    for token in ids:
        forced = g.forced()
        hits += bool(forced) and forced[0] == token
        g.advance(token)
    return hits


def _step_stats(name: str, samples: list[float]) -> dict:
    if not samples:
        return {f"{name}_n": 0, f"{name}_median_us": None, f"{name}_p99_us": None}
    values = np.asarray(samples)
    return {f"{name}_n": len(values), f"{name}_median_us": round(float(np.median(values)), 2),
            f"{name}_p99_us": round(float(np.percentile(values, 99)), 2)}


def _failure(number: int, test: dict, text: str, kind: str, detail: str, path: str = "") -> dict:
    return {"test": number, "description": str(test.get("description", ""))[:120], "kind": kind, "path": path,
            "detail": detail, "text": text[:MAX_TEXT] + ("..." if len(text) > MAX_TEXT else "")}


def _where_rejected(guide, text: str, ids: list[int], walked: int, regex_ok: bool) -> tuple[str, str]:
    """Where the walk died: (JSON pointer, "<where>: ...text before|text after...")."""
    data = text.encode()
    if regex_ok:  # token-level: the byte DFA accepts, a token (or the end) did not
        offset = len(b"".join(guide.index.vocabulary.token_bytes[i] for i in ids[:walked]))
        what = f"token {walked} ({guide.index.vocabulary.token_bytes[ids[walked]]!r})" if walked < len(ids) else "end"
    else:
        offset, what = _dfa_death(guide.index.dfa, data), "byte"
    chars = len(data[:offset].decode("utf-8", errors="ignore"))
    path = "" if chars >= len(text) else json_path_at(text, chars)
    where = "end of text (incomplete)" if chars >= len(text) else f"{what} at {path}"
    return path, f"{where}: ...{text[max(0, chars - 40):chars]}\u2038{text[chars:chars + 25]}..."


def _dfa_death(dfa, data: bytes) -> int:
    state = 0
    for offset, byte in enumerate(data):
        state = int(dfa.row(state)[byte])  # the DFA is lazy: row() fills the row on first use
        if state < 0:
            return offset
    return len(data)


def json_path_at(text: str, pos: int) -> str:
    """JSON pointer of the value containing character `pos` of compact JSON; "/a/b/<key>" for b's key."""
    path = _path_parts_at(text, pos)
    return "".join("/" + (p if p == "<key>" else p.replace("~", "~0").replace("/", "~1")) for p in path) or "/"


def _path_parts_at(text: str, pos: int) -> list[str]:
    decoder, path, i = json.JSONDecoder(), [], 0
    while i < len(text) and text[i] in "{[":
        closing, j, index = "}" if text[i] == "{" else "]", i + 1, 0
        found = False
        while j < len(text) and text[j] != closing:
            if closing == "}":
                key, key_end = decoder.raw_decode(text, j)
                if pos < key_end:
                    return path + [str(key), "<key>"]
                j = key_end + 1
            else:
                key = index
            end = decoder.raw_decode(text, j)[1]
            if pos < end:
                path.append(str(key))
                i, found = j, True
                break
            j, index = (end + 1 if end < len(text) and text[end] == "," else end), index + 1
        if not found:
            break
    return path


def _jsonschema_verdict(schema, data) -> str:
    """A second opinion on an 'invalid' instance the guide accepts: what jsonschema says is wrong."""
    if schema is None:
        return ""
    try:
        from assisted.inputs import validator_class

        cls = validator_class(schema)  # the dialect the guide reads
        errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(data))
    except Exception as error:
        return f"jsonschema could not check it ({type(error).__name__})"
    if not errors:
        return "jsonschema also accepts it (label disagrees)"
    error = errors[0]
    return f"jsonschema: {error.validator} at /{'/'.join(map(str, error.absolute_path))}: {error.message[:160]}"

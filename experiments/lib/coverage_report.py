"""Coverage run -> summary.json, summary.md (tables next to the published anchors), coverage.png."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
from collections import Counter
from pathlib import Path

import numpy as np

from experiments.lib.report import cpu_name, git, pyplot, save_figure, table


# Published on JSONSchemaBench (Geng et al. 2025, 11,306 schemas; MaskBench is a 2,778-schema sample).
ANCHORS = {"llguidance": {"covered": 0.79}, "XGrammar": {"covered": 0.72},
           "outlines-core": {"covered": 0.62, "p50_ms": 588.0, "p90_ms": 26_700.0}}
GOALS = {"covered": 0.80, "p50_ms": 100.0, "p90_ms": 2000.0, "revisit_us": 50.0, "first_ms": 20.0, "walk_s": 2.0}
SUMMED = {"valid_instances": "n_valid", "invalid_instances": "n_invalid"}  # summary key -> schemas.csv column


def _num(value) -> float | None:
    return None if value in (None, "") else float(value)


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "max": None}
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "max": float(a.max())}


def hist_quantile(hist, q: float) -> float | None:
    """Quantile of the samples binned in STEP_BINS (geometric interpolation inside a bin)."""
    from experiments.lib.coverage_worker import STEP_BINS

    hist = np.asarray(hist, dtype=float)
    if hist.sum() == 0:
        return None
    cum = np.cumsum(hist) / hist.sum()
    i = int(np.searchsorted(cum, q))
    below = cum[i - 1] if i else 0.0
    frac = (q - below) / max(cum[i] - below, 1e-12)
    return float(STEP_BINS[i] * (STEP_BINS[i + 1] / STEP_BINS[i]) ** frac)


def summarize_group(rows: list[dict], timeout: float) -> dict:
    """Counts and timings for a set of per-schema rows."""
    n = len(rows)
    status = Counter(r["status"] for r in rows)
    compiled = [r for r in rows if r["status"] in ("covered", "not_covered")]
    ints = lambda key, chosen=compiled: sum(int(float(r.get(key) or 0)) for r in chosen)  # noqa: E731
    compile_ms = [float(r["compile_ms"]) for r in compiled]
    compile_cpu = [float(r["compile_cpu_ms"]) for r in compiled if _num(r.get("compile_cpu_ms")) is not None]
    loads = [float(r["load"]) for r in rows if _num(r.get("load")) is not None]
    with_timeouts = compile_ms + [timeout * 1000] * sum(
        r["status"] == "timeout" and str(r.get("stage")).startswith("compile") for r in rows
    )
    tokens, forced = ints("tokens_valid"), ints("forced_tokens")
    group = {"schemas": n, "covered": status["covered"], "covered_share": status["covered"] / n if n else 0.0,
             "compiled": len(compiled), "not_covered": status["not_covered"], "unsupported": status["unsupported"],
             "errors": status["error"], "timeouts": status["timeout"] + status["memory"],
             "covered_without_tests": sum(r["status"] == "covered" and not ints("n_valid", [r]) + ints("n_invalid", [r])
                                          for r in compiled)}
    # summed over the compiled schemas; "..._schemas": how many of them have any
    for key in ("valid_instances", "invalid_instances", "false_reject_schemas", "false_rejects", "false_rejects_regex",
                "false_rejects_token", "false_accept_schemas", "false_accepts", "false_accepts_regex_only",
                "walk_errors", "tokenization_mismatch"):
        column = SUMMED.get(key, key.replace("_schemas", "s"))
        group[key] = sum(ints(column, [r]) > 0 for r in compiled) if key.endswith("_schemas") else ints(column)
    return {**group, "compile_ms": _quantiles(compile_ms), "compile_ms_with_timeouts": _quantiles(with_timeouts),
            "compile_cpu_ms": _quantiles(compile_cpu), "load_mean": float(np.mean(loads)) if loads else None,
            "tokens_valid": tokens, "forced_tokens": forced, "forced_share": forced / tokens if tokens else None}


def _longest_walk(rows: list[dict]) -> dict:
    """The longest whole walk of one valid instance (mask()+advance() over its tokens) per schema: median and max."""
    walks = [(float(r["walk_max_ms"]), r["file"]) for r in rows if _num(r.get("walk_max_ms")) is not None]
    if not walks:
        return {"n": 0, "median_ms": None, "max_ms": None, "max_file": None}
    longest = max(walks)
    return {"n": len(walks), "median_ms": float(np.median([w for w, _ in walks])), "max_ms": longest[0],
            "max_file": longest[1]}


def _longest_walk_row(walk: dict) -> str:
    if not walk["n"]:
        return "| whole walk of one valid instance | | | 0 | |"
    return (f"| whole walk of one valid instance (its longest, per schema) | {_ms(walk['median_ms'])} ms | "
            f"{_ms(walk['max_ms'])} ms (`{walk['max_file']}`) | {walk['n']:,} schemas | < {GOALS['walk_s']:g} s |")


def summarize(rows: list[dict], failures: list[dict], hist_first, hist_revisit, setup: dict) -> dict:
    timeout = float(setup.get("timeout_s", 30))
    subsets = sorted({r["subset"] for r in rows})
    unsupported = Counter(r["keyword"] for r in rows if r["status"] == "unsupported")
    peak = [float(r["peak_rss_mb"]) for r in rows if _num(r.get("peak_rss_mb"))]
    growth = [float(r["rss_growth_mb"]) for r in rows if _num(r.get("rss_growth_mb")) is not None]
    steps = {name: {"n": int(np.sum(h)), "median_us": hist_quantile(h, 0.5), "p99_us": hist_quantile(h, 0.99)}
             for name, h in (("first_visit", hist_first), ("revisit", hist_revisit))}
    return {"setup": setup, "environment": environment(), "overall": summarize_group(rows, timeout),
        "subsets": {s: summarize_group([r for r in rows if r["subset"] == s], timeout) for s in subsets},
        "unsupported_keywords": unsupported.most_common(),
        "errors": [{k: r.get(k, "") for k in ("file", "status", "error_type", "message", "where", "stage")}
                   for r in rows if r["status"] in ("error", "timeout", "memory")],
        "false_accepts": [f for f in failures if f["kind"] in ("false_accept", "false_accept_regex_only")],
        "mask_advance": steps,
        "longest_walk": _longest_walk(rows),
        "memory_mb": {"worker_peak_rss_max": max(peak, default=None),
                      "growth_p50": _quantiles(growth)["p50"], "growth_max": max(growth, default=None)},
        "histograms": {"first_visit": np.asarray(hist_first).tolist(), "revisit": np.asarray(hist_revisit).tolist()}}


def environment() -> dict:
    """The run's date, machine, versions and commit."""
    import torch
    import transformers
    return {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "commit": git("rev-parse", "--short", "HEAD")}


def write_report(out: Path, totals: dict, setup: dict) -> dict:
    """summary.json, summary.md, coverage.png and README.md of a run's `totals` (`experiments.coverage`)."""
    summary = summarize(totals["rows"], totals["failures"], totals["hist_first"], totals["hist_revisit"], setup)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "summary.md").write_text(markdown(summary))
    plot(summary, totals["rows"], out / "coverage.png")
    env = summary["environment"]
    (out / "README.md").write_text(
        f"Coverage run of {env['date']}: "
        f"`{setup.get('command') or 'python -m experiments.coverage --tokenizer ' + setup['tokenizer']}` on "
        f"{setup['files']} MaskBench files, {env['cores']}-core {env['cpu']} CPU, {setup['workers']} workers, timeout "
        f"{setup['timeout_s']:g} s, compile options "
        f"{setup.get('options') or 'default (closed objects, schema order)'}; Python {env['python']}, torch "
        f"{env['torch']}, transformers {env['transformers']}, numpy {env['numpy']}; {fsm_note(setup)}. Files: "
        "summary.md (tables), coverage.png, schemas.csv (one row per schema), failures.csv (false rejects/accepts per "
        "instance), summary.json.\n")
    return summary


def rebuild(out: Path) -> dict:
    """Re-render summary.md/png/json from schemas.csv, failures.csv and the old summary.json."""
    old = json.loads((out / "summary.json").read_text())
    totals = {"rows": _read(out / "schemas.csv"), "failures": _read(out / "failures.csv"),
              "hist_first": np.asarray(old["histograms"]["first_visit"]),
              "hist_revisit": np.asarray(old["histograms"]["revisit"])}
    return write_report(out, totals, old["setup"])


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fsm_note(setup: dict) -> str:
    fsm = setup.get("fsm") or {}
    if not fsm:
        return "fsm version not recorded"
    if fsm["same_as_head"]:
        return f"fsm as committed in {fsm['head']}"
    return f"fsm from the working tree on top of {fsm['head']} (uncommitted, sources sha1 {fsm['sources_sha1']})"


def _load(x) -> str:
    return "not recorded" if x is None else f"{x:.1f}"


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _ms(x) -> str:
    return "" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}")


def _us(x) -> str:
    return "" if x is None else (f"{x / 1000:.1f} ms" if x >= 1000 else f"{x:.1f} µs")


def headline(summary: dict) -> str:
    o, steps = summary["overall"], summary["mask_advance"]
    c = o["compile_ms"]
    return (f"covered {o['covered']}/{o['schemas']} ({_pct(o['covered_share'])}); unsupported {o['unsupported']}, "
        f"errors {o['errors']}, timeouts {o['timeouts']}; false rejects {o['false_rejects']} instances in "
        f"{o['false_reject_schemas']} schemas; false accepts {o['false_accepts']} in {o['false_accept_schemas']} "
        f"schemas; compile p50 {_ms(c['p50'])} ms, p90 {_ms(c['p90'])} ms, max {_ms(c['max'])} ms; "
        f"mask+advance first visit {_us(steps['first_visit']['median_us'])} (p99 "
        f"{_us(steps['first_visit']['p99_us'])}), revisit {_us(steps['revisit']['median_us'])} (p99 "
        f"{_us(steps['revisit']['p99_us'])}); forced share {_pct(o['forced_share'])}")


def _subset_cells(name: str, g: dict) -> list:
    """One row of the per-subset table."""
    c = g["compile_ms"]
    return [name, g["schemas"], g["covered"], _pct(g["covered_share"]), g["unsupported"], g["timeouts"], g["errors"],
            f"{g['false_rejects']} ({g['false_reject_schemas']})",
            f"{g['false_accepts']} ({g['false_accept_schemas']})", _ms(c["p50"]), _ms(c["p90"]), _ms(c["max"]),
            _pct(g["forced_share"])]


def markdown(summary: dict) -> str:
    s, o, env, steps = summary["setup"], summary["overall"], summary["environment"], summary["mask_advance"]
    c, ct = o["compile_ms"], o["compile_ms_with_timeouts"]
    lines = [f"# JSONSchemaBench (MaskBench) coverage — tokenizer `{s['tokenizer']}`", "",
             f"{env['date']}, {env['cores']}-core {env['cpu']}, {s['workers']} workers, timeout {s['timeout_s']:g} s "
             f"per stage, {s['files']} schema files, {o['valid_instances']} valid + {o['invalid_instances']} invalid "
             f"instances (compact JSON, key order kept, tokenized by the tokenizer); {fsm_note(s)}.", "",
             "## Against the anchors", "", "| | covered | compile p50 | compile p90 | false accepts |",
             "|---|---|---|---|---|",
             f"| **this run** | **{_pct(o['covered_share'])}** | **{_ms(c['p50'])} ms** | **{_ms(c['p90'])} ms** "
             f"({_ms(ct['p90'])} ms counting compile timeouts as {s['timeout_s']:g} s) | **{o['false_accepts']}** in "
             f"{o['false_accept_schemas']} schemas |",
             f"| this run, worker CPU time | | {_ms(o['compile_cpu_ms']['p50'])} ms | "
             f"{_ms(o['compile_cpu_ms']['p90'])} ms | |",
             f"| goal (issue 5) | >= {_pct(GOALS['covered'])} | <= {GOALS['p50_ms']:g} ms | "
             f"<= {GOALS['p90_ms']:,.0f} ms | 0 |"]
    lines += [f"| {name} | {_pct(a['covered'])} | {_ms(a.get('p50_ms'))}{' ms' if 'p50_ms' in a else ''} | "
              f"{_ms(a.get('p90_ms'))}{' ms' if 'p90_ms' in a else ''} | "
              f"{'drops constraints' if name == 'outlines-core' else ''} |" for name, a in ANCHORS.items()]
    lines += [
        "", "Anchors: published JSONSchemaBench numbers (Geng et al. 2025, 11,306 schemas, other hardware); this run "
        "uses the 2,778-schema MaskBench sample. Compile time is schema -> ready guide (regex, DFA, token index, first "
        "mask), wall clock in the worker; the CPU-time row is what it costs on an idle core (the machine was shared: "
        f"mean 1-min load average {_load(o['load_mean'])} on {env['cores']} cores during the run). Time limits are "
        f"{s['timeout_s']:g} s of worker CPU time per stage (compile, walk), at most 10x that in wall time.", "",
        "## Per subset", "",
        *table(["subset", "schemas", "covered", "covered %", "unsupported", "timeout", "error",
                "false rejects (schemas)", "false accepts (schemas)", "compile p50 ms", "p90 ms", "max ms",
                "forced share"],
               [*(_subset_cells(name, g) for name, g in summary["subsets"].items()), _subset_cells("**all**", o)]),
        "", f"Covered counts {o['covered_without_tests']} compiled schemas that have no test instances. False rejects "
        f"split into {o['false_rejects_regex']} regex-level (the byte DFA rejects the text) and "
        f"{o['false_rejects_token']} token-level (the DFA accepts the text but the tokenizer's own token sequence "
        "cannot be walked). Invalid instances that only the tokenization kept out (the DFA accepts them): "
        f"{o['false_accepts_regex_only']}. Instances whose tokens do not spell the text: {o['tokenization_mismatch']}.",
        "", "## Speed along the valid instances", "", "| | median | p99 | steps | goal |", "|---|---|---|---|---|",
        f"| mask()+advance(), first visit of a state | {_us(steps['first_visit']['median_us'])} | "
        f"{_us(steps['first_visit']['p99_us'])} | {steps['first_visit']['n']:,} | < {GOALS['first_ms']:g} ms |",
        f"| mask()+advance(), revisit | {_us(steps['revisit']['median_us'])} | {_us(steps['revisit']['p99_us'])} | "
        f"{steps['revisit']['n']:,} | < {GOALS['revisit_us']:g} µs |", _longest_walk_row(summary["longest_walk"]),
        "", f"Forced tokens: {o['forced_tokens']:,} of {o['tokens_valid']:,} tokens of the accepted valid instances "
        f"({_pct(o['forced_share'])}) equal the first token `guide.forced()` proposes at their position. Memory: "
        f"worker peak RSS max {_ms(summary['memory_mb']['worker_peak_rss_max'])} MB (includes the shared tokenizer); "
        f"growth per schema median {_ms(summary['memory_mb']['growth_p50'])} MB, max "
        f"{_ms(summary['memory_mb']['growth_max'])} MB.", "", "## Top unsupported keywords", "",
        *table(["keyword", "schemas"], [[f"`{k}`", n] for k, n in summary["unsupported_keywords"][:20]]), ""]
    lines += _problem_lists(summary)
    return "\n".join(lines) + "\n"


def _problem_lists(summary: dict) -> list[str]:
    lines = [f"## False accepts ({len(summary['false_accepts'])})", ""]
    lines += [f"- `{f['file']}` test {f['test']} ({f['kind']}): `{_cell(f['text'][:120])}` — {f['detail']}"
              for f in summary["false_accepts"][:100]]
    lines += ["", f"## Errors and timeouts ({len(summary['errors'])})", ""]
    lines += [f"- `{e['file']}` {e['status']} {e.get('error_type') or ''} "
              f"{('at ' + e['where']) if e.get('where') else ''}: {str(e.get('message') or '')[:160]}"
              for e in summary["errors"][:200]]
    return lines + [""]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("`", "'").replace("\n", " ")


def plot(summary: dict, rows: list[dict], path: Path) -> None:
    """Coverage per subset (stacked bars, the anchors marked) and the compile time's distribution."""
    fig, (bars, cdf) = pyplot().subplots(1, 2, figsize=(14, 6.5), gridspec_kw={"width_ratios": [1.3, 1]})
    groups = {**summary["subsets"], "ALL": summary["overall"]}
    names = list(groups)[::-1]
    parts = [("covered", "#2a9d4b"), ("false reject", "#e9c46a"), ("false accept", "#d62828"),
             ("unsupported", "#8d99ae"), ("timeout", "#6a4c93"), ("error", "#000000")]
    left = np.zeros(len(names))
    for label, color in parts:
        values = np.array([_share(groups[n], label) for n in names])
        bars.barh(names, values, left=left, color=color, label=label)
        left += values
    for name, a in ANCHORS.items():
        bars.axvline(100 * a["covered"], ls="--", lw=1, color="grey")
        bars.text(100 * a["covered"], len(names) - 0.4, name, rotation=90, va="top", ha="right", fontsize=7)
    bars.set(xlabel="% of schemas", xlim=(0, 100), title=f"MaskBench coverage per subset "
                                                           f"({summary['setup']['tokenizer']})")
    bars.legend(loc="lower left", fontsize=7, ncol=3)
    for key, label in (("compile_ms", "wall clock"), ("compile_cpu_ms", "worker CPU time")):
        values = np.sort([float(r[key]) for r in rows
                          if r["status"] in ("covered", "not_covered") and _num(r.get(key)) is not None])
        if len(values):
            cdf.step(values, np.arange(1, len(values) + 1) / len(rows) * 100, where="post", label=f"this run, {label}")
    cdf.plot([588, 26_700], [50, 90], "x", color="#d62828", label="outlines-core p50 / p90")
    cdf.set(xscale="log", xlabel="schema -> ready guide (ms)", ylabel="% of all schemas compiled within",
            ylim=(0, 100), title="Compile time CDF (failed compiles never reach the top)")
    cdf.grid(True, which="both", alpha=0.3), cdf.legend(fontsize=8)
    save_figure(fig, path)


def _share(g: dict, label: str) -> float:
    n = g["schemas"] or 1
    fa = g["false_accept_schemas"]
    fr_only = g["not_covered"] - fa  # not covered without false accepts: false rejects / walk errors
    value = {"covered": g["covered"], "false reject": max(fr_only, 0), "false accept": fa,
             "unsupported": g["unsupported"], "timeout": g["timeouts"], "error": g["errors"]}[label]
    return 100 * value / n

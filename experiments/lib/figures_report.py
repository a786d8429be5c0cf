"""The figures and README of an `experiments.figures` run, drawn from its CSVs and run.json alone.

Every ratio is paired per unit (a prompt or task and a repeat, at one temperature): the geometric mean over units
of the reference's seconds per new token / the system's (> 1: the system is faster; ours full against each system:
seconds per object), with a 90% Student-t interval (`experiments.lib.intervals.paired_ratio`; one unit: no
interval). A system that raised is listed, never timed. Each PNG carries a footer naming the
model pair, setup, machine, date, commit and the number of units, so the picture alone does not mislead.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from experiments.lib.intervals import paired_ratio
from experiments.lib.report import bar_groups, pyplot, read_rows, save_figure

# systems of `experiments.lib.systems`, the reference first and ours (judged against every other) last
PLAIN = ("target", "hf-default", "hf-heuristic", "ours-auto")
STRUCTURED = ("xgrammar-compact", "constrained+forced", "full")  # the structured view's default
STRUCTURED_ORDER = ("xgrammar-compact", "xgrammar", "xgrammar+assistant", "ours-processor", "ours-processor+assistant",
                    "constrained", "constrained+forced", "full-no-lookup", "full")  # every system it can run
LEVEL = "90%"
LABELS = {"target": "target alone", "hf-default": "transformers assisted (defaults)",
          "hf-heuristic": "transformers assisted (heuristic)", "ours-auto": "ours (auto)",
          "xgrammar-compact": "transformers + XGrammar (target alone)", "xgrammar": "transformers + XGrammar (its "
          "defaults: any whitespace)", "xgrammar+assistant": "transformers assisted + XGrammar",
          "constrained+forced": "ours plain constrained (no assistant)", "full": "ours full (assistant, auto)"}


def label(system: str) -> str:
    return LABELS.get(system, system)


def read_csv(path: Path) -> list[dict]:
    """Rows of plain.csv or structured.csv with their types back."""
    return read_rows(path, text=("class", "prompt", "system", "task", "error", "text"))


def units(rows: list[dict], item: str, per_token: bool = True) -> dict:
    """{(item, T, repeat): {system: seconds per new token, or per object}} over the rows of one view (`item`:
    "prompt"/"task") that ran without an error."""
    out: dict = {}
    for r in rows:
        if not r.get("error"):
            cost = r["seconds"] / max(r["new_tokens"], 1) if per_token else r["seconds"]
            out.setdefault((r[item], r["temperature"], r["repeat"]), {})[r["system"]] = cost
    return out


def speedup(chosen: list[dict], base: str, system: str) -> tuple[float, float, float, int]:
    """(ratio, low, high, n): `system`'s paired speedup over `base` across the units of `chosen` holding both."""
    pairs = [(u[base], u[system]) for u in chosen if base in u and system in u]
    return (*paired_ratio(pairs), len(pairs)) if pairs else (math.nan, math.nan, math.nan, 0)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan  # a run cut short may miss a cell


def _systems(rows: list[dict], order) -> list[str]:
    held = {r["system"] for r in rows}
    return [s for s in order if s in held]


def footer(info: dict, view: str) -> str:
    """Two lines under a figure: what ran, where, when, how much."""
    machine = next((m.removeprefix("- machine: ") for m in info["machine"] if m.startswith("- machine:")), "?")
    commit = next((m.removeprefix("- code: ") for m in info["machine"] if m.startswith("- code:")), "?")
    commit += "".join(f", resumed at {x.split('commit ')[-1]}" for x in info.get("resumed", []))
    return (f"{info['setup']}; {info['threads']} thread(s); {info['date']}, {commit}\n{view}\n"
            f"{machine.split(', shared')[0]}, shared; {LEVEL} t-intervals on paired ratios; {info['llama_cpp']}")


def _ratio_axis(ax, label: str) -> None:
    """A log-scaled ratio axis (2x and 0.5x equally far from 1) with plain tick labels and the line at 1."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator
    ax.set_yscale("log"), ax.axhline(1.0, color="gray", lw=0.8)
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.yaxis.set_minor_locator(LogLocator(subs=())), ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_ylabel(label + f"\n(geometric mean per new token, {LEVEL} interval)")


def _errorbar(ax, x, stats, **kw) -> None:
    """Points with their interval (none drawn where a point has a single unit)."""
    ys = [s[0] for s in stats]
    low = [0 if math.isnan(s[1]) else s[0] - s[1] for s in stats]
    high = [0 if math.isnan(s[2]) else s[2] - s[0] for s in stats]
    ax.errorbar(x, ys, yerr=[low, high], marker="o", capsize=3, **kw)


def _save(fig, info: dict, view: str, path: Path) -> None:
    fig.text(0.01, 0.005, footer(info, view), fontsize=6.5, va="bottom", ha="left", color="0.25")
    save_figure(fig, path, rect=(0, 0.1, 1, 1))


def greedy_figure(rows: list[dict], info: dict, out: Path) -> None:
    """Plain text: left, median latency per new token per class at T = 0; right, speedup over the target alone per
    class, with intervals."""
    greedy = [r for r in rows if r["temperature"] == 0]
    systems, groups = _systems(greedy, PLAIN), sorted({r["class"] for r in greedy})
    of = {r["prompt"]: r["class"] for r in greedy}
    u = units(greedy, "prompt")
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.2))
    bar_groups(left, groups, systems, lambda g, s: 1000 * _median([r["seconds"] / max(r["new_tokens"], 1) for r in
                                                                   greedy if r["class"] == g and r["system"] == s]),
               label)
    left.set_ylabel("median latency per new token (ms)"), left.set_title("plain text: latency (greedy)")
    left.legend(fontsize=7)
    group_axes(right, {g: [v for k, v in u.items() if g == "all" or of[k[0]] == g] for g in [*groups, "all"]},
               systems, "target", systems[-1], 1)
    _ratio_axis(right, f"speedup over the {label('target')}")
    right.set_title("plain text: speedup (greedy)"), right.legend(fontsize=7)
    _save(fig, info, f"greedy, {len(u)} units", out / "greedy.png")


def group_axes(ax, members: dict, systems: list[str], base: str, counted: str, shift: float) -> None:
    """Per group (`members`: name -> its units), each system's speedup over `base` with its interval, side by side
    (`shift`: the first system's offset); the ticks name the units `counted` holds."""
    names = list(members)
    for j, s in enumerate(x for x in systems if x != base):
        stats = [speedup(members[g], base, s) for g in names]
        _errorbar(ax, [i + 0.12 * (j - shift) for i in range(len(names))], stats, ls="none", label=label(s))
    ax.set_xticks(range(len(names)), [f"{g}\n(n={speedup(members[g], base, counted)[3]})" for g in names])


def temperature_axes(ax, rows: list[dict], order, base: str, item: str, valid: dict | None = None) -> int:
    """Speedup over `base` against temperature, one line per system, with intervals; returns units per T."""
    u = units(rows, item)
    temps = sorted({k[1] for k in u})
    for j, s in enumerate(x for x in _systems(rows, order) if x != base):
        stats = [speedup([v for k, v in u.items() if k[1] == t], base, s) for t in temps]
        name = label(s) + (f" (valid {valid[s]})" if valid else "")
        _errorbar(ax, [t + 0.015 * (j - 1) for t in temps], stats, label=name)
    _ratio_axis(ax, "speedup over " + ("the target alone" if base == "target" else "XGrammar's processor"))
    ax.set_xlabel("sampling temperature (0: greedy)"), ax.set_xticks(temps), ax.legend(fontsize=7)
    return max((sum(1 for k in u if k[1] == t) for t in temps), default=0)


def sampling_figure(rows: list[dict], info: dict, out: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    n = temperature_axes(ax, rows, PLAIN, "target", "prompt")
    ax.set_title("plain text: speedup over the target alone as the temperature rises")
    view = f"{n} units (prompts x repeats) per temperature, {info['max_new_tokens']} new tokens"
    _save(fig, info, view, out / "sampling.png")


def validity(rows: list[dict]) -> dict:
    """{system: "valid/total"} over every object a system wrote."""
    return {s: f"{sum(r['valid'] for r in rows if r['system'] == s)}/{sum(r['system'] == s for r in rows)}"
            for s in _systems(rows, STRUCTURED_ORDER)}


def structured_figure(rows: list[dict], info: dict, out: Path) -> None:
    """Left: per-task greedy speedup over transformers + XGrammar; right: speedup against temperature."""
    order = STRUCTURED_ORDER
    base, valid = order[0], validity(rows)
    greedy = [r for r in rows if r["temperature"] == 0]
    u = units(greedy, "task")
    tasks = sorted({k[0] for k in u})
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.2))
    group_axes(left, {g: [v for k, v in u.items() if g in ("all", k[0])] for g in [*tasks, "all"]},
               _systems(rows, order), base, "full", 0.5)
    _ratio_axis(left, "speedup over XGrammar's processor")
    left.set_title("JSON extraction, greedy, per task"), left.legend(fontsize=7)
    n = temperature_axes(right, rows, order, base, "task", valid)
    right.set_title("JSON extraction against temperature\n(reference: transformers + XGrammar, target alone)",
                    fontsize=10)
    view = (f"{len(tasks)} tasks x {info['repeats']} repeat(s) per temperature, at most "
            f"{info['structured_max_new_tokens']} new tokens, every object validated ({n} units per T)")
    _save(fig, info, view, out / "structured.png")


def over(rows: list[dict], order, base: str) -> list[tuple[str, str, str]]:
    """(column, base, system): each system of `rows` against the reference `base`."""
    return [(label(s), base, s) for s in _systems(rows, order) if s != base]


def against(rows: list[dict], order, judged: str) -> list[tuple[str, str, str]]:
    """(column, base, system): `judged` (ours) against each other system of `rows`."""
    return [(f"over {label(s)}", s, judged) for s in _systems(rows, order) if s != judged]


def _ratio_table(rows: list[dict], item: str, key: str, columns, per_token: bool = True) -> list[str]:
    """Markdown: per value of `key` (a group column or "temperature") and over all units, one column per
    (name, base, system) of `columns`: system's paired speedup over base."""
    u = units(rows, item, per_token)
    of = {r[item]: r[key] for r in rows}
    values = sorted({of[k[0]] if key != "temperature" else k[1] for k in u})
    lines = [f"| {key} | units | " + " | ".join(c[0] for c in columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for value in [*values, "all"]:
        chosen = [v for k, v in u.items() if value == "all" or (k[1] if key == "temperature" else of[k[0]]) == value]
        cells = [speedup(chosen, base, system) for _, base, system in columns]
        lines.append(f"| {value} | {cells[0][3] if cells else 0} | "
                     + " | ".join(f"{r:.2f} [{lo:.2f}, {hi:.2f}]" for r, lo, hi, _ in cells) + " |")
    return lines


def _invalid(rows: list[dict], budget: int) -> str:
    """What the invalid objects were: cut at the token budget (an unfinished object) or not."""
    bad = [r for r in rows if not r["valid"]]
    cut = sum(r["new_tokens"] >= budget and not r["error"] for r in bad)
    return f"Of {len(bad)} invalid, {cut} were cut at the budget of {budget} new tokens (unfinished objects)."


def finished(rows: list[dict], item: str) -> str:
    """How much of a view the CSV holds: its items, their temperatures and its rows (a run cut short says so)."""
    names, temps = sorted({r[item] for r in rows}), sorted({r["temperature"] for r in rows})
    return (f"{len(names)} {item}s ({', '.join(names)}) x {len(temps)} temperatures "
            f"({', '.join(f'{t:g}' for t in temps)}), {len(rows)} generations")


def readme(info: dict, plain: list[dict], structured: list[dict]) -> list[str]:
    lines = [f"# Headline figures: {info['setup']}", "", f"- command: `{info['command']}`", f"- date: {info['date']}",
             *info["machine"], f"- {info['versions']}, torch threads {info['threads']}",
             f"- plain view: the {info['half']} half of experiments/prompts/split.json, "
             f"{info['per_class'] or 'all'} prompt(s) per class, {info['repeats']} repeat(s), "
             f"{info['max_new_tokens']} new tokens; structured view: "
             f"at most {info['structured_max_new_tokens']} new tokens", f"- {info['llama_cpp']}",
             f"- finished: {finished(plain, 'prompt')} (plain), {finished(structured, 'task')} (structured)",
             *(f"- resumed (the cells not yet written): {x}" for x in info.get("resumed", [])),
             *(f"- note: {x}" for x in info.get("notes", [])), "",
             "Speedups are paired per unit (prompt or task, repeat, temperature): geometric mean of the reference's "
             f"seconds per new token / the system's, {LEVEL} t-interval (one unit: none). Systems interleaved per "
             "cell, order rotated. The CPU was shared with other jobs: timings are noisy.", ""]
    if plain:
        greedy = [r for r in plain if r["temperature"] == 0]
        lines += ["## Plain text, greedy, per class (over the target alone)", "",
                  *_ratio_table(greedy, "prompt", "class", over(greedy, PLAIN, "target")), "",
                  "![greedy](greedy.png)", "", "## Plain text, per temperature (over the target alone)", "",
                  *_ratio_table(plain, "prompt", "temperature", over(plain, PLAIN, "target")), "",
                  "![sampling](sampling.png)", "", "Ours (auto) against each system, per class (every temperature):",
                  "", *_ratio_table(plain, "prompt", "class", against(plain, PLAIN, "ours-auto")), ""]
    if structured:
        lines += structured_lines(structured, info["structured_max_new_tokens"])
    return lines


def structured_lines(rows: list[dict], budget: int) -> list[str]:
    """The structured view's README section: speedups per token over the reference, ours full per object over
    every system, validity and the errors systems raised."""
    base, greedy = STRUCTURED_ORDER[0], [r for r in rows if r["temperature"] == 0]
    errors = sorted({f"{r['system']}: {r['error']}" for r in rows if r["error"]})
    return ["## JSON extraction (over transformers + XGrammar's processor, the target alone, compact JSON)", "",
            *_ratio_table(rows, "task", "temperature", over(rows, STRUCTURED_ORDER, base)), "", "Greedy, per task:",
            "", *_ratio_table(greedy, "task", "task", over(greedy, STRUCTURED_ORDER, base)), "",
            "Ours full against each system, seconds per object (what an object costs, however many tokens: "
            "XGrammar's defaults spend more of them on whitespace):", "",
            *_ratio_table(rows, "task", "temperature", against(rows, STRUCTURED_ORDER, "full"), per_token=False), "",
            "Valid objects (jsonschema): " + ", ".join(f"{label(s)} {v}" for s, v in validity(rows).items())
            + ". " + _invalid(rows, budget), *(f"- error, {e}" for e in errors), "",
            "![structured](structured.png)", ""]


def report(out: Path) -> None:
    """greedy.png, sampling.png, structured.png and README.md of the run in `out`."""
    info = json.loads((out / "run.json").read_text())
    plain = read_csv(out / "plain.csv") if (out / "plain.csv").exists() else []
    structured = read_csv(out / "structured.csv") if (out / "structured.csv").exists() else []
    if plain:
        greedy_figure(plain, info, out)
        sampling_figure(plain, info, out)
    if structured:
        structured_figure(structured, info, out)
    (out / "README.md").write_text("\n".join(readme(info, plain, structured)))

"""The 4-bit and 6-bit kernels' paths against the machine's read bandwidth: one-row (decode) and 5-row (verify) calls.

    python -m experiments.kernel_paths --threads 1 2 --repeats 20 --out DIR

For each thread count: a read loop's bandwidth over 1 GiB (`read_bandwidth`), then each path this CPU runs
(`structspec_ops.int4.paths()`) on the Qwen2.5-1.5B MLP's shapes, for a Q4_K and a Q6_K weight (`structspec_ops.q6k`:
the file's down_proj half the time), interleaved call by call; per path the median
seconds per call, the weight bytes read per second and that as a fraction of the read loop's (1.0 = at the memory
limit). Each call reads another copy of the weight, from a working set of `WORKING_SET` bytes (far past the last-level
cache), as a decode step reads every layer's weights once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import platform
import statistics
import time

import torch

from structspec_ops import int4, q6k
from experiments.lib import cli

SHAPES = {"gate/up (8960 x 1536)": (8960, 1536), "down (1536 x 8960)": (1536, 8960)}
WORKING_SET = 512e6  # bytes of weight copies cycled through


def read_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second of the best of `repeats` full reads (a sum) of a `gib` GiB float32 buffer."""
    torch.set_num_threads(threads)
    buffer = torch.ones(int(gib * 2**30) // 4)  # float32
    buffer.sum()  # touch every page
    best = min(_seconds(buffer.sum) for _ in range(repeats))
    return buffer.numel() * 4 / best


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(threads: int, repeats: int, rows: int) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    results = {}
    for shape, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features) * 0.02
        for kind, (packed, call) in {"Q4_K": (int4.pack(int4.quantize(weight)), int4.linear),
                                     "Q6_K": (q6k.pack(q6k.quantize(weight)), q6k.linear)}.items():
            results[f"{shape} {kind}"] = _paths(packed, call, rows, repeats)
    return results


def _paths(packed, call, rows: int, repeats: int) -> dict:
    """Per path: median seconds of `call(x, packed copy)`, the bytes and bytes per second."""
    copies = [dataclasses.replace(packed, data=packed.data.clone())
              for _ in range(max(1, int(WORKING_SET // packed.data.numel())))]
    x = torch.randn(rows, packed.in_features)
    times: dict[str, list[float]] = {path: [] for path in int4.paths()}
    weights = itertools.cycle(copies)  # every call reads a copy not in any cache
    for _ in range(repeats):
        for path in times:  # interleaved: every path sees the same machine state
            with int4.forced_path(path):
                weight = next(weights)
                times[path].append(_seconds(lambda: call(x, weight)))
    return {path: {"seconds": statistics.median(t), "bytes": packed.data.numel(),
                   "bytes_per_second": packed.data.numel() / statistics.median(t)} for path, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("kernel_paths", __doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5])
    cli.add_out(parser, required=False)
    args = parser.parse_args(argv)
    report = {"machine": platform.processor() or platform.machine(), "paths": list(int4.paths()), "runs": []}
    for threads in args.threads:
        bandwidth = read_bandwidth(threads)
        for rows in args.rows:
            run = {"threads": threads, "rows": rows, "read_bandwidth": bandwidth,
                   "shapes": measure(threads, args.repeats, rows)}
            report["runs"].append(run)
            for shape, paths in run["shapes"].items():
                for path, m in paths.items():
                    print(f"{threads} thr, {rows} rows, {shape}, {path:8s}: {m['seconds'] * 1e3:7.2f} ms, "
                          f"{m['bytes_per_second'] / 1e9:5.1f} GB/s = {m['bytes_per_second'] / bandwidth:.2f} "
                          f"of the read loop ({bandwidth / 1e9:.1f} GB/s)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernel_paths.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

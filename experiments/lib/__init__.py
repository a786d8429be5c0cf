"""The benchmark harness (arguments, task registry, systems, interleaved runner, paired intervals, report writer,
forward-cost timer) and the helpers of single studies; none is run by itself. The runnable modules are one level up
(`python -m experiments.<module>`; `experiments/README.md` indexes them)."""

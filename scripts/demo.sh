#!/usr/bin/env bash
# The main job, from a fresh machine: trains a small model with torchext's
# fused ASGD + GradScaler next to torch.optim.ASGD + torch.amp.GradScaler,
# printing the losses side by side and the step-time ratio.
#   bash scripts/demo.sh [--steps N] [--device cpu|cuda]   # torch 2.15.0, the newest
#   TORCH_VERSION=2.11.0 bash scripts/demo.sh             # another from 2.11 to 2.15
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$PY" examples/train_demo.py "$@"

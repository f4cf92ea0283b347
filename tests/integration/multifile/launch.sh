#!/bin/bash
# Data-parallel training on every core of the host.
set -euo pipefail
cd "$(dirname "$0")"
PJRT_DEVICE=NEURON python scripts/train_ddp.py "$@"

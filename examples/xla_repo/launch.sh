#!/bin/bash
# Launcher of the XLA era: torch_xla settings, a pre-compilation pass, then the real run.
set -euo pipefail
cd "$(dirname "$0")"

export PJRT_DEVICE=NEURON
export NEURONCORE_NUM_DEVICES=2
export XLA_IR_DEBUG=1 XLA_HLO_DEBUG=1
export NEURON_CC_FLAGS="--model-type transformer --auto-cast=none"
export NEURON_RT_STOCHASTIC_ROUNDING_EN=1

if [[ "${PRECOMPILE:-0}" == 1 ]]; then
  echo "pre-compiling graphs"
  neuron_parallel_compile python train.py
fi
echo "training"
python -u train.py

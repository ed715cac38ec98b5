#!/bin/bash
# TorchTitan 0.2.2 on 2 H200 (torch 2.11), from the repository root with .whl (the wheels) and .bench_data carried;
# build first (tests/multi_gpu/run.sh ONLY=build), then:
export NCCL_NVLS_ENABLE=0
# 64k/: 64K tokens per GPU, 8 layers, 10 steps (flex: its compile did not finish within RUN_S=150 s)
OUT=$OUT/64k LAYERS=8 STEPS=10 SEQ=65536 RUN_S=150 DEADLINE_S=550 CONFIGS="cad local local_balanced torch_varlen flex" \
  bash integrations/torchtitan/bench_gpu.sh
# 128k/: 128K tokens per GPU, 8 layers, 8 steps
OUT=$OUT/128k LAYERS=8 STEPS=8 SEQ=131072 RUN_S=120 DEADLINE_S=400 CONFIGS="cad local local_balanced torch_varlen" \
  bash integrations/torchtitan/bench_gpu.sh

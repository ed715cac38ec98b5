#!/bin/bash
# 2 H200, a second round of ../trainer_h200x2_2026-11-27_24bbc98/'s 64K/128K comparison, distca added; the same warm machine after the
# TorchTitan calls), from the repository root with .bench_data carried (doclen_pretrain.json):
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1; R=$OUT/r; mkdir -p $R
NGPU=2 OUT=$R/a ONLY=train CONTEXTS="65536 131072" STEPS=6 LAYERS="65536:2 131072:2" \
  CONFIGS=local,local_balanced,distca,prefix_aware TRAINER_ARGS="--sync-attention-timing off" TRAIN_BUDGET_S=390 \
  bash tests/multi_gpu/run.sh > $R/a.log 2>&1

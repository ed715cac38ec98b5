// trainer_calibration.h -- the overhead terms of a real training step that the kernel-level model
// (step_model.h) leaves out, each fitted to measured trainer runs (examples/train_llama.py: FSDP2, full
// activation checkpointing, gradient accumulation; docs/multi_gpu.md). One JSON file per trainer and GPU
// kind (docs/simulate/trainer_h200.json, written by bench/simulate/trainer_check.py --fit); every value
// names the runs it was fitted to in the file's "source" keys.
//
// Schema (every key required, numbers >= 0 unless said otherwise):
//   {
//     "trainer": "examples/train_llama.py ...",
//     "fitted_on": ["bench/results/trainer_h200x2_2026-11-26_f420ed7"],
//     "layer_us_per_token": 4.2,         // a decoder layer's work outside core attention, per token and
//                                        // micro-batch: forward, recomputed forward, backward (GEMMs,
//                                        // norms, rotary, FSDP2's gathers and reduce-scatters)
//     "head_us_per_token": 9.5,          // per token outside the layers: embedding, LM head, chunked loss
//     "step_fixed_ms": 0,                // per step: optimizer, gradient norm, the last reduce-scatter
//     "attention_scale": 1.0,            // the trainer's measured attention call / the rate table's kernel
//                                        // time (> 0): synchronised call timing, launch gaps
//     "torch_varlen_attention_scale": 1.5,  // the same for PyTorch's varlen_attn (K/V expanded for GQA)
//     "attention_call_us": 2500,         // per attention call (forward, recomputed forward, backward) beyond
//                                        // the kernels, any kernel: host work and the timing's CUDA syncs
//     "plan_make_ms": 5.0,               // CAD's plan make per plan (all-gather, balancer, device tables)
//     "plan_make_us_per_task": 1.0,      // ... plus per task the rank serves
//     "plan_make_ns_per_token": 50,      // ... plus per token of the rank (device tables)
//     "exchange_fixed_us": 500,          // per CAD exchange pass (forward, recomputed forward, backward) of
//                                        // one layer beyond the NCCL curve: launches, events, small-message
//                                        // latency
//     "pack_unpack_ns_per_byte": 0.01,   // per byte a rank sends or receives in an exchange: gather into and
//                                        // scatter out of the wire buffers
//     "pingpong_compute_factor": 1.07,   // (>= 1) compute of a pass while CAD's ping-pong exchanges run
//                                        // beside it, over the same compute without ping-pong
//     "source": {"<key>": "how it was fitted", ...}
//   }
#pragma once

#include <map>
#include <string>

namespace cad::simulate {

struct TrainerCalibration {
  std::string path;
  std::string trainer;
  std::string fitted_on;  // the runs, comma-separated
  double layer_us_per_token = 0;
  double head_us_per_token = 0;
  double step_fixed_ms = 0;
  double attention_scale = 1;
  double torch_varlen_attention_scale = 1;
  double attention_call_us = 0;
  double plan_make_ms = 0;
  double plan_make_us_per_task = 0;
  double plan_make_ns_per_token = 0;
  double exchange_fixed_us = 0;
  double pack_unpack_ns_per_byte = 0;
  double pingpong_compute_factor = 1;
  std::map<std::string, std::string> source;  // key -> how it was fitted
};

// Throws std::invalid_argument "FILE: key 'k' ..." naming the missing or bad key.
TrainerCalibration load_trainer_calibration(const std::string& path);
TrainerCalibration parse_trainer_calibration(const std::string& json_text, const std::string& name);

}  // namespace cad::simulate

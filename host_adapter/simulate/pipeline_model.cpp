// pipeline_model.cpp -- the GPipe schedule and one tick's price (see pipeline_model.h).
#include "pipeline_model.h"

#include <algorithm>
#include <stdexcept>

#include "comm_model.h"

namespace cad::simulate {

std::vector<GpipeTick> gpipe_schedule(int64_t stages, int64_t microbatches) {
  if (stages < 1) throw std::invalid_argument("gpipe_schedule: stages must be >= 1");
  if (microbatches < 1) throw std::invalid_argument("gpipe_schedule: micro-batches must be >= 1");
  const int64_t ticks = microbatches + stages - 1;
  std::vector<GpipeTick> out;
  out.reserve(static_cast<size_t>(2 * ticks));
  for (int phase = 0; phase < 2; ++phase) {
    for (int64_t i = 0; i < ticks; ++i) {
      GpipeTick t;
      t.backward = phase == 1;
      t.index = i;
      // Backward tick i runs forward tick T - 1 - i's micro-batches (train_pipeline.py: the last first).
      const int64_t forward_tick = t.backward ? ticks - 1 - i : i;
      for (int64_t s = 0; s < stages; ++s) {
        const int64_t m = forward_tick - s;
        t.micro_batch.push_back(m >= 0 && m < microbatches ? m : -1);
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

TickRankTime tick_rank_time(const RankWork& work, bool backward, bool joins_calls, bool moves_work, bool last_stage,
                            const SystemCalibration& cal, const TrainerCalibration& tcal,
                            const TrainerOptions& options) {
  TickRankTime t;
  t.tokens = work.tokens;
  const double tokens = static_cast<double>(work.tokens);
  const double recompute = options.checkpointing ? 1.0 : 0.0;
  // Forward units of a layer's non-attention work in this tick (pipeline_model.h: 4 units in all with
  // checkpointing, the calibration's layer term being those 4).
  const double units = backward ? recompute + 2.0 : 1.0;
  t.non_attention = tokens * tcal.layer_us_per_token * 1e-6 * units / 4.0;
  // The head and loss: the trainer's chunked loss recomputes each chunk's logits in the backward
  // (train_llama.py "loss chunk"), so, like a checkpointed layer, 1 forward unit of 4 in the forward tick and the
  // recomputation and backward (3) in the backward tick, whatever --checkpointing says.
  if (last_stage && work.tokens > 0) t.head = tokens * tcal.head_us_per_token * 1e-6 * (backward ? 3.0 : 1.0) / 4.0;
  if (joins_calls) {
    const double calls = backward ? recompute + 1.0 : 1.0;
    const double kernel = backward ? recompute * work.attention.fwd + work.attention.bwd : work.attention.fwd;
    t.attention = options.kernel_scale * kernel + calls * tcal.attention_call_us * 1e-6;
    if (moves_work) {
      const RankBytes& b = work.bytes;
      const double moved = b.sent_intra + b.received_intra + b.sent_inter + b.received_inter;
      const double per_pass =
          all_to_all_seconds(cal, b) + tcal.exchange_fixed_us * 1e-6 + moved * tcal.pack_unpack_ns_per_byte * 1e-9;
      t.exchange = calls * per_pass;  // one exchange pass per attention call
    }
  }
  t.total = t.non_attention + t.attention + t.exchange;  // per layer; the layers and head are added by the caller
  return t;
}

double tick_seconds(const std::vector<TickRankTime>& ranks, int64_t layers_per_stage, PipelinePool pool) {
  if (ranks.empty()) throw std::invalid_argument("tick_seconds: no ranks");
  if (layers_per_stage < 1) throw std::invalid_argument("tick_seconds: layers per stage must be >= 1");
  const double layers = static_cast<double>(layers_per_stage);
  if (pool != PipelinePool::kTick) {
    // Ranks meet only at the send/recv between ticks (and, under --pool stage, inside their own stage's calls,
    // whose layers are alike, so the per-layer maximum is the rank's maximum).
    double slowest = 0;
    for (const TickRankTime& r : ranks) slowest = std::max(slowest, layers * r.total + r.head);
    return slowest;
  }
  // Every attention call is collective over all ranks: per layer, the slowest non-attention part, then the
  // slowest server with its exchange; the head (one rank's) is added once.
  double non_attention = 0, attention = 0, head = 0;
  for (const TickRankTime& r : ranks) {
    non_attention = std::max(non_attention, r.non_attention);
    attention = std::max(attention, r.attention + r.exchange);
    head = std::max(head, r.head);
  }
  return layers * (non_attention + attention) + head;
}

}  // namespace cad::simulate

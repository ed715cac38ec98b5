// trainer_model.cpp -- a rank's micro-batch in a real training step (see trainer_model.h).
#include "trainer_model.h"

#include <algorithm>
#include <stdexcept>

#include "comm_model.h"

namespace cad::simulate {

TrainerRankTime trainer_rank_time(const RankWork& work, bool moves_work, int64_t plan_tasks, const ModelShape& shape,
                                  const Layout& layout, const SystemCalibration& cal, const TrainerCalibration& tcal,
                                  const TrainerOptions& options, bool pingpong) {
  const double tokens = static_cast<double>(work.tokens);
  const double layers = static_cast<double>(shape.layers / layout.pp);
  const double passes = options.checkpointing ? 2.0 : 1.0;  // forward passes per layer

  TrainerRankTime t;
  const double layer_linear = tokens * tcal.layer_us_per_token * 1e-6;
  const double head = tokens * tcal.head_us_per_token * 1e-6;
  const double kernel = options.kernel_scale * (passes * work.attention.fwd + work.attention.bwd) +
                        (passes + 1) * tcal.attention_call_us * 1e-6;
  double exchange = 0;
  if (moves_work) {
    const RankBytes& b = work.bytes;
    const double moved = b.sent_intra + b.received_intra + b.sent_inter + b.received_inter;
    const double per_pass =
        all_to_all_seconds(cal, b) + tcal.exchange_fixed_us * 1e-6 + moved * tcal.pack_unpack_ns_per_byte * 1e-9;
    exchange = (passes + 1) * per_pass;
  }
  const double plans = moves_work ? (pingpong ? 2.0 : 1.0) : 0.0;
  t.plan = moves_work ? plans * tcal.plan_make_ms * 1e-3 + tokens * tcal.plan_make_ns_per_token * 1e-9 +
                           static_cast<double>(plan_tasks) * tcal.plan_make_us_per_task * 1e-6
                     : 0.0;

  t.linear = layers * layer_linear + head;
  t.attention = layers * kernel;
  t.exchange = layers * exchange;
  const double compute = layers * (layer_linear + kernel);
  if (pingpong && moves_work) {
    const double slowed = tcal.pingpong_compute_factor * compute;
    const double layers_time = overlapped_seconds(slowed, t.exchange, cal.overlap);
    t.exchange_exposed = layers_time - slowed;
    t.total = head + layers_time + t.plan;
  } else {
    // Ping-pong without exchanges (colocated) has nothing to hide and is priced as no ping-pong.
    t.exchange_exposed = t.exchange;
    t.total = head + compute + t.exchange + t.plan;
  }
  return t;
}

double trainer_step_seconds(const std::vector<std::vector<double>>& times, const TrainerCalibration& tcal) {
  if (times.empty()) throw std::invalid_argument("trainer_step_seconds: no micro-batches");
  double step = tcal.step_fixed_ms * 1e-3;
  for (const auto& m : times) {
    if (m.empty()) throw std::invalid_argument("trainer_step_seconds: a micro-batch with no ranks");
    step += *std::max_element(m.begin(), m.end());
  }
  return step;
}

}  // namespace cad::simulate

// pipeline_model.cpp -- the pipeline trainer's timetables (GPipe, 1F1B) and one tick's price (see
// pipeline_model.h).
#include "pipeline_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm_model.h"

namespace cad::simulate {

namespace {

void check_shape(const char* what, int64_t stages, int64_t microbatches) {
  if (stages < 1) throw std::invalid_argument(std::string(what) + ": stages must be >= 1");
  if (microbatches < 1) throw std::invalid_argument(std::string(what) + ": micro-batches must be >= 1");
}

void add_call(TickRankTime& t, const CallTime& c) {
  t.kernel += c.kernel;
  t.attention += c.attention;
  t.exchange += c.exchange;
}

}  // namespace

std::vector<GpipeTick> gpipe_schedule(int64_t stages, int64_t microbatches) {
  check_shape("gpipe_schedule", stages, microbatches);
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

bool gpipe_bubble_tick(int64_t stages, int64_t microbatches, int64_t forward_tick) {
  check_shape("gpipe_bubble_tick", stages, microbatches);
  if (forward_tick < 0 || forward_tick >= microbatches + stages - 1) {
    throw std::invalid_argument("gpipe_bubble_tick: forward tick " + std::to_string(forward_tick) +
                                " outside the step's " + std::to_string(microbatches + stages - 1));
  }
  // Stage s runs micro-batch t - s: all stages busy iff t - (PP - 1) >= 0 and t < M.
  return forward_tick < stages - 1 || forward_tick >= microbatches;
}

PipelinePool gpipe_tick_pool(PipelinePool pool, int64_t stages, int64_t microbatches, int64_t forward_tick) {
  if (pool != PipelinePool::kBubble && pool != PipelinePool::kBubbleStage) return pool;
  if (gpipe_bubble_tick(stages, microbatches, forward_tick)) return PipelinePool::kTick;
  return pool == PipelinePool::kBubble ? PipelinePool::kLocal : PipelinePool::kStage;
}

std::vector<std::vector<StageOp>> one_f_one_b_schedule(int64_t stages, int64_t microbatches) {
  check_shape("one_f_one_b_schedule", stages, microbatches);
  // Each stage's operations in PipeDream-flush's order.
  std::vector<std::vector<StageOp>> order(static_cast<size_t>(stages));
  for (int64_t s = 0; s < stages; ++s) {
    std::vector<StageOp>& ops = order[static_cast<size_t>(s)];
    const int64_t warm = std::min(stages - s - 1, microbatches);
    for (int64_t m = 0; m < warm; ++m) ops.push_back({false, m});
    for (int64_t i = 0; i < microbatches - warm; ++i) {
      ops.push_back({false, warm + i});
      ops.push_back({true, i});
    }
    for (int64_t m = microbatches - warm; m < microbatches; ++m) ops.push_back({true, m});
  }
  // done[(backward x stages + s) x M + m]: the tick at which stage s ran that operation, -1 not yet.
  std::vector<int64_t> done(static_cast<size_t>(2 * stages * microbatches), -1);
  const auto ran = [&](bool backward, int64_t s, int64_t m) -> int64_t& {
    return done[static_cast<size_t>(((backward ? stages : 0) + s) * microbatches + m)];
  };
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<std::vector<StageOp>> table;
  for (;;) {
    const int64_t tick = static_cast<int64_t>(table.size());
    std::vector<StageOp> row(static_cast<size_t>(stages));
    bool left = false, any = false;
    for (int64_t s = 0; s < stages; ++s) {
      const std::vector<StageOp>& ops = order[static_cast<size_t>(s)];
      if (next[static_cast<size_t>(s)] == ops.size()) continue;
      left = true;
      const StageOp op = ops[next[static_cast<size_t>(s)]];
      // What it needs must have run at an earlier tick (a tick's outputs travel at its end); stage 0's forwards
      // need nothing.
      const auto before = [&](int64_t at) { return at >= 0 && at < tick; };
      const bool ready = !op.backward ? s == 0 || before(ran(false, s - 1, op.micro_batch))
                         : s < stages - 1 ? before(ran(true, s + 1, op.micro_batch))
                                          : before(ran(false, s, op.micro_batch));
      if (ready) {
        row[static_cast<size_t>(s)] = op;
        any = true;
      }
    }
    if (!left) break;
    // PipeDream-flush's order never deadlocks; a tick where nothing can run would be a bug here.
    if (!any) throw std::logic_error("one_f_one_b_schedule: no stage can run at tick " + std::to_string(tick));
    for (int64_t s = 0; s < stages; ++s) {
      const StageOp& op = row[static_cast<size_t>(s)];
      if (op.micro_batch < 0) continue;
      ran(op.backward, s, op.micro_batch) = tick;
      ++next[static_cast<size_t>(s)];
    }
    table.push_back(std::move(row));
  }
  return table;
}

bool one_f_one_b_bubble_tick(const std::vector<StageOp>& ops) {
  if (ops.empty()) throw std::invalid_argument("one_f_one_b_bubble_tick: no stage");
  return std::any_of(ops.begin(), ops.end(), [](const StageOp& op) { return op.micro_batch < 0; });
}

PipelinePool one_f_one_b_tick_pool(PipelinePool pool, const std::vector<StageOp>& ops) {
  if (pool != PipelinePool::kBubble) return pool;
  return one_f_one_b_bubble_tick(ops) ? PipelinePool::kTick : PipelinePool::kLocal;
}

CallTime call_time(const RankWork& work, bool backward, bool moves_work, const SystemCalibration& cal,
                   const TrainerCalibration& tcal, const TrainerOptions& options) {
  CallTime c;
  c.kernel = backward ? work.attention.bwd : work.attention.fwd;
  c.attention = options.kernel_scale * c.kernel + tcal.attention_call_us * 1e-6;
  if (moves_work) {  // one exchange pass per attention call
    const RankBytes& b = work.bytes;
    const double moved = b.sent_intra + b.received_intra + b.sent_inter + b.received_inter;
    c.exchange =
        all_to_all_seconds(cal, b) + tcal.exchange_fixed_us * 1e-6 + moved * tcal.pack_unpack_ns_per_byte * 1e-9;
  }
  return c;
}

std::vector<bool> op_calls(bool backward, const TrainerOptions& options) {
  if (!backward) return {false};
  if (options.checkpointing) return {false, true};
  return {true};
}

TickRankTime op_time(int64_t tokens, bool backward, bool last_stage, const TrainerCalibration& tcal,
                     const TrainerOptions& options) {
  TickRankTime t;
  t.tokens = tokens;
  const double n = static_cast<double>(tokens);
  const double recompute = options.checkpointing ? 1.0 : 0.0;
  // Forward units of a layer's non-attention work in this tick (pipeline_model.h: 4 units in all with
  // checkpointing, the calibration's layer term being those 4).
  const double units = backward ? recompute + 2.0 : 1.0;
  t.non_attention = n * tcal.layer_us_per_token * 1e-6 * units / 4.0;
  // The head and loss: the trainer's chunked loss recomputes each chunk's logits in the backward
  // (train_llama.py "loss chunk"), so, like a checkpointed layer, 1 forward unit of 4 in the forward tick and the
  // recomputation and backward (3) in the backward tick, whatever --checkpointing says.
  if (last_stage && tokens > 0) t.head = n * tcal.head_us_per_token * 1e-6 * (backward ? 3.0 : 1.0) / 4.0;
  t.total = t.non_attention;
  return t;
}

TickRankTime tick_rank_time(const RankWork& work, bool backward, bool joins_calls, bool moves_work, bool last_stage,
                            const SystemCalibration& cal, const TrainerCalibration& tcal,
                            const TrainerOptions& options) {
  TickRankTime t = op_time(work.tokens, backward, last_stage, tcal, options);
  if (joins_calls) {
    for (const bool b : op_calls(backward, options)) add_call(t, call_time(work, b, moves_work, cal, tcal, options));
  }
  t.total = t.non_attention + t.attention + t.exchange;  // per layer; the layers and head are added by the caller
  return t;
}

RankTime tick_critical_path(const std::vector<TickRankTime>& ranks, const std::vector<std::vector<CallTime>>& calls,
                            int64_t layers_per_stage, PipelinePool pool) {
  if (ranks.empty()) throw std::invalid_argument("tick_critical_path: no ranks");
  if (layers_per_stage < 1) throw std::invalid_argument("tick_critical_path: layers per stage must be >= 1");
  if (pool == PipelinePool::kBubble || pool == PipelinePool::kBubbleStage) {
    throw std::invalid_argument("tick_critical_path: a tick is priced as tick-pooled, stage-pooled or local, not "
                                "as a mix (gpipe_tick_pool)");
  }
  const double layers = static_cast<double>(layers_per_stage);
  RankTime t;
  if (pool != PipelinePool::kTick) {
    // Ranks meet only at the send/recv between ticks (and, under --pool stage, inside their own stage's calls,
    // whose layers are alike, so the per-layer maximum is the rank's maximum): the slowest rank alone.
    const auto alone = [&](const TickRankTime& r) { return layers * r.total + r.head; };
    const auto slowest = std::max_element(
        ranks.begin(), ranks.end(), [&](const TickRankTime& a, const TickRankTime& b) { return alone(a) < alone(b); });
    t.linear = layers * slowest->non_attention + slowest->head;
    t.attention = layers * slowest->attention;
    t.comm = layers * slowest->exchange;
    t.total = alone(*slowest);
  } else {
    // Every attention call is collective over all ranks: per layer, the slowest non-attention part, then each
    // call's slowest server with its exchange; the head (one rank's) is added once.
    double non_attention = 0, head = 0, calls_s = 0, attention = 0;
    for (const TickRankTime& r : ranks) {
      non_attention = std::max(non_attention, r.non_attention);
      head = std::max(head, r.head);
    }
    for (const std::vector<CallTime>& call : calls) {
      double slowest = 0, slowest_attention = 0;
      for (const CallTime& c : call) {
        slowest = std::max(slowest, c.attention + c.exchange);
        slowest_attention = std::max(slowest_attention, c.attention);
      }
      calls_s += slowest;
      attention += slowest_attention;
    }
    t.total = layers * (non_attention + calls_s) + head;
    t.linear = layers * non_attention + head;
    t.attention = layers * attention;
    t.comm = t.total - t.linear - t.attention;
  }
  t.comm_exposed = t.comm;
  return t;
}

RankTime gpipe_tick_critical_path(const std::vector<TickRankTime>& ranks, int64_t layers_per_stage,
                                  PipelinePool pool) {
  // A GPipe tick's calls on every stage are one plan's, in one direction: each rank's taken as one call.
  std::vector<std::vector<CallTime>> calls;
  if (pool == PipelinePool::kTick) {
    calls.emplace_back();
    for (const TickRankTime& r : ranks) calls.back().push_back({r.kernel, r.attention, r.exchange});
  }
  return tick_critical_path(ranks, calls, layers_per_stage, pool);
}

double tick_seconds(const std::vector<TickRankTime>& ranks, int64_t layers_per_stage, PipelinePool pool) {
  return gpipe_tick_critical_path(ranks, layers_per_stage, pool).total;
}

bool stages_exchange(const std::vector<StageOp>& ops, int64_t stage) {
  const int64_t stages = static_cast<int64_t>(ops.size());
  if (stage < 0 || stage + 1 >= stages) throw std::invalid_argument("stages_exchange: no stage after this one");
  const StageOp& before = ops[static_cast<size_t>(stage)];
  const StageOp& after = ops[static_cast<size_t>(stage + 1)];
  // train_pipeline.py exchange_1f1b: a forward sends its activation on (the last stage's forward ends in the
  // loss, but it has no stage after it), a backward its gradient back (the first stage's has no stage before).
  return (before.micro_batch >= 0 && !before.backward) || (after.micro_batch >= 0 && after.backward);
}

OneFOneBClocks::OneFOneBClocks(PipelinePool pool, int64_t stages, int64_t dp, int64_t layers_per_stage)
    : pool_(pool), stages_(stages), dp_(dp), layers_(layers_per_stage) {
  if (pool == PipelinePool::kTick) {
    throw std::invalid_argument("OneFOneBClocks: not for --pool tick (every call meets every rank: its step is the "
                                "sum of its ticks)");
  }
  if (stages < 1 || dp < 1 || layers_per_stage < 1) {
    throw std::invalid_argument("OneFOneBClocks: needs >= 1 stage, replica and layer per stage");
  }
  clock_.assign(static_cast<size_t>(stages * dp), 0.0);
}

void OneFOneBClocks::add(const std::vector<StageOp>& ops, const std::vector<TickRankTime>& ranks) {
  if (static_cast<int64_t>(ops.size()) != stages_ || static_cast<int64_t>(ranks.size()) != stages_ * dp_) {
    throw std::invalid_argument("OneFOneBClocks::add: expected " + std::to_string(stages_) + " stages of " +
                                std::to_string(dp_) + " ranks");
  }
  if (pool_ == PipelinePool::kBubble && one_f_one_b_bubble_tick(ops)) {
    throw std::invalid_argument("OneFOneBClocks::add: under --pool bubble a tick with an idle stage is pooled "
                                "(add_pooled)");
  }
  const double layers = static_cast<double>(layers_);
  const auto rank = [&](int64_t s, int64_t r) { return static_cast<size_t>(s * dp_ + r); };
  // Where each rank's own work of the tick ends (an idle rank's clock stays). Under kBubble this is a steady
  // tick, local attention: each rank alone, as under kLocal.
  std::vector<double> done = clock_;
  for (int64_t s = 0; s < stages_; ++s) {
    if (ops[static_cast<size_t>(s)].micro_batch < 0) continue;
    if (pool_ == PipelinePool::kStage) {
      // The stage's replicas meet at every call of their plan: the first call waits for the last of them to
      // arrive, each layer for the slowest. Taken as: they start at the latest clock, take the slowest's time.
      double start = 0, slowest = 0;
      for (int64_t r = 0; r < dp_; ++r) {
        start = std::max(start, clock_[rank(s, r)]);
        slowest = std::max(slowest, layers * ranks[rank(s, r)].total + ranks[rank(s, r)].head);
      }
      for (int64_t r = 0; r < dp_; ++r) done[rank(s, r)] = start + slowest;
    } else {
      for (int64_t r = 0; r < dp_; ++r) {
        done[rank(s, r)] = clock_[rank(s, r)] + layers * ranks[rank(s, r)].total + ranks[rank(s, r)].head;
      }
    }
  }
  // The tick's batched send/recv: the trainer waits for it on the host (work.wait with a timeout), so a rank's
  // next tick starts when every transfer of its batch is done, i.e. when each neighbour it exchanges with has
  // finished its own work of the tick. A middle stage's transfers with its two neighbours progress
  // independently, so it waits for each neighbour's own end, not for that neighbour's other transfer.
  clock_ = done;
  for (int64_t s = 0; s + 1 < stages_; ++s) {
    if (!stages_exchange(ops, s)) continue;
    for (int64_t r = 0; r < dp_; ++r) {
      const double both = std::max(done[rank(s, r)], done[rank(s + 1, r)]);
      clock_[rank(s, r)] = std::max(clock_[rank(s, r)], both);
      clock_[rank(s + 1, r)] = std::max(clock_[rank(s + 1, r)], both);
    }
  }
}

void OneFOneBClocks::add_pooled(double tick_seconds) {
  if (pool_ != PipelinePool::kBubble) {
    throw std::invalid_argument("OneFOneBClocks::add_pooled: only --pool bubble pools some ticks");
  }
  // Every rank makes every call of a pooled tick and each call waits for its slowest server, so no rank gets
  // past the tick's first call before the last rank arrives: all start at the latest clock. From there the
  // tick's pooled price (one_f_one_b_tick under kTick) already moves every rank in lockstep, so all end
  // together; the send at the tick's end then has both sides ready and adds no wait. (An early rank could run
  // its first layer's projections before that first call; the tick's price, the slowest non-attention of every
  // layer plus its calls, does not credit it.)
  const double start = *std::max_element(clock_.begin(), clock_.end());
  std::fill(clock_.begin(), clock_.end(), start + tick_seconds);
}

double OneFOneBClocks::seconds() const { return *std::max_element(clock_.begin(), clock_.end()); }

PricedTick one_f_one_b_tick(const std::vector<StageOp>& ops, const std::vector<std::vector<RankWork>>& plans,
                            int64_t dp, int64_t layers_per_stage, PipelinePool pool, const SystemCalibration& cal,
                            const TrainerCalibration& tcal, const TrainerOptions& options) {
  const int64_t stages = static_cast<int64_t>(ops.size());
  if (stages < 1 || dp < 1) throw std::invalid_argument("one_f_one_b_tick: needs >= 1 stage and replica");
  const int64_t ranks = stages * dp;
  const auto plan = [&](int64_t stage) -> const std::vector<RankWork>& {
    const size_t i = static_cast<size_t>(ops[static_cast<size_t>(stage)].micro_batch * stages + stage);
    if (i >= plans.size() || static_cast<int64_t>(plans[i].size()) != ranks) {
      throw std::invalid_argument("one_f_one_b_tick: no plan of " + std::to_string(ranks) + " ranks for stage " +
                                  std::to_string(stage) + "'s micro-batch");
    }
    return plans[i];
  };
  // The tick's calls per layer, in stage order (as cad.CallOrder makes them): (stage, backward).
  std::vector<std::pair<int64_t, bool>> calls;
  for (int64_t s = 0; s < stages; ++s) {
    const StageOp& op = ops[static_cast<size_t>(s)];
    if (op.micro_batch < 0) continue;
    for (const bool b : op_calls(op.backward, options)) calls.emplace_back(s, b);
  }
  PricedTick out;
  std::vector<std::vector<CallTime>> call_times(calls.size(), std::vector<CallTime>(static_cast<size_t>(ranks)));
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t stage = r / dp;
    const StageOp& own = ops[static_cast<size_t>(stage)];
    TickRankTime t;
    if (own.micro_batch >= 0) {
      t = op_time(plan(stage)[static_cast<size_t>(r)].tokens, own.backward, stage == stages - 1, tcal, options);
    }
    for (size_t c = 0; c < calls.size(); ++c) {
      // Under tick pooling a rank makes every call of the tick (its own with its tokens, the others' as a
      // server); otherwise only its own operation's.
      if (pool != PipelinePool::kTick && calls[c].first != stage) continue;
      const RankWork& work = plan(calls[c].first)[static_cast<size_t>(r)];
      CallTime& ct = call_times[c][static_cast<size_t>(r)];
      ct = call_time(work, calls[c].second, pool != PipelinePool::kLocal, cal, tcal, options);
      add_call(t, ct);
    }
    t.total = t.non_attention + t.attention + t.exchange;
    out.ranks.push_back(t);
  }
  out.critical = tick_critical_path(out.ranks, call_times, layers_per_stage, pool);
  return out;
}

}  // namespace cad::simulate

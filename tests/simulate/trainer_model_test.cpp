// The trainer model's overhead terms (tools/simulate/trainer_model.h) on hand-checked cases: each
// term adds what the calibration says, ping-pong hides at most what it can overlap, the step grows with
// every overhead term, the calibration file's refusals, and --batch-seeds prices exactly the batches named.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "calibration_fixture.h"
#include "simulation.h"
#include "trainer_calibration.h"
#include "trainer_model.h"

namespace sim = cad::simulate;

namespace {

// layers 2, hidden 4, heads 2, kv 1, D 2, mlp 8, vocab 10.
sim::ModelShape tiny() { return {"tiny", 2, 4, 2, 1, 2, 8, 10}; }
sim::Layout one_node(int64_t gpus) { return sim::Layout{gpus, gpus, 1, 1}; }
// NVLink: 1e6 B at 10 GB/s, 1e8 B at 100 GB/s.
sim::SystemCalibration system() { return sim::testing::calibration(1, 1, 0, {{1e6, 10}, {1e8, 100}}); }

// Every term zero: the trainer model then prices the kernels alone.
sim::TrainerCalibration zero() {
  sim::TrainerCalibration c;
  c.path = "test";
  c.attention_scale = 1;
  c.torch_varlen_attention_scale = 1;
  c.pingpong_compute_factor = 1;
  return c;
}

// 1000 tokens, 10 ms forward and 25 ms backward kernel per layer, 1e6 bytes sent and received (100 us
// on the curve's first point, 10 GB/s).
sim::RankWork work() {
  sim::RankWork w;
  w.tokens = 1000;
  w.attention.fwd = 0.010;
  w.attention.bwd = 0.025;
  w.bytes.sent_intra = 1e6;
  w.bytes.received_intra = 1e6;
  return w;
}

sim::TrainerRankTime price(const sim::TrainerCalibration& c, bool moves_work = true, bool pingpong = false,
                           bool checkpointing = true, int64_t tasks = 10) {
  sim::TrainerOptions o;
  o.checkpointing = checkpointing;
  o.kernel_scale = c.attention_scale;
  return sim::trainer_rank_time(work(), moves_work, tasks, tiny(), one_node(2), system(), c, o, pingpong);
}

const char* kValid = R"({"trainer": "t", "fitted_on": ["run9"], "layer_us_per_token": 3, "head_us_per_token": 9,
  "step_fixed_ms": 0, "attention_scale": 1.02, "torch_varlen_attention_scale": 1.6, "attention_call_us": 1000,
  "plan_make_ms": 5, "plan_make_us_per_task": 90, "plan_make_ns_per_token": 50, "exchange_fixed_us": 50,
  "pack_unpack_ns_per_byte": 0.01, "pingpong_compute_factor": 1.1, "source": {"layer_us_per_token": "fit"}})";

std::string refusal(const std::string& text) {
  try {
    sim::parse_trainer_calibration(text, "t.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string with(const std::string& key, const std::string& value) {
  std::string text = kValid;
  const size_t at = text.find("\"" + key + "\": ");
  const size_t begin = at + key.size() + 4;
  const size_t end = text.find_first_of(",}", begin);
  return text.substr(0, begin) + value + text.substr(end);
}

}  // namespace

TEST(SimulateTrainer, KernelsAloneWithCheckpointing) {
  // Forward twice (recomputed) + backward, per layer: 2 x (2 x 10 + 25) ms; exchange 3 passes x 100 us.
  const sim::TrainerRankTime t = price(zero());
  EXPECT_NEAR(t.attention, 2 * 0.045, 1e-12);
  EXPECT_NEAR(t.exchange, 2 * 3 * 1e-4, 1e-12);
  EXPECT_NEAR(t.total, t.attention + t.exchange, 1e-12);
  EXPECT_DOUBLE_EQ(t.plan, 0);
  // Without checkpointing: one forward, two exchange passes.
  const sim::TrainerRankTime n = price(zero(), true, false, false);
  EXPECT_NEAR(n.attention, 2 * 0.035, 1e-12);
  EXPECT_NEAR(n.exchange, 2 * 2 * 1e-4, 1e-12);
}

TEST(SimulateTrainer, PlanCostIsWhatTheCalibrationSaysPerMicroBatch) {
  sim::TrainerCalibration c = zero();
  c.plan_make_ms = 5;
  c.plan_make_us_per_task = 100;
  c.plan_make_ns_per_token = 50;
  // One plan: 5 ms + 10 tasks x 100 us + 1000 tokens x 50 ns.
  const double one = 5e-3 + 10 * 100e-6 + 1000 * 50e-9;
  EXPECT_NEAR(price(c).plan, one, 1e-15);
  EXPECT_NEAR(price(c).total - price(zero()).total, one, 1e-12);
  // Ping-pong makes two plans (one per nano-batch) of the same tokens and tasks: one more fixed part.
  EXPECT_NEAR(price(c, true, true).plan, one + 5e-3, 1e-15);
  // Colocated makes no plan and exchanges nothing.
  EXPECT_DOUBLE_EQ(price(c, false).plan, 0);
  EXPECT_DOUBLE_EQ(price(c, false).exchange, 0);
  // The step: the slowest rank of each micro-batch, plus the fixed part.
  c.step_fixed_ms = 7;
  EXPECT_NEAR(sim::trainer_step_seconds({{1.0, 2.0}, {4.0, 3.0}}, c), 6.007, 1e-12);
  EXPECT_THROW(sim::trainer_step_seconds({}, c), std::invalid_argument);
}

TEST(SimulateTrainer, ExchangeAndCallTerms) {
  sim::TrainerCalibration c = zero();
  c.exchange_fixed_us = 200;
  c.pack_unpack_ns_per_byte = 0.5;
  c.attention_call_us = 1000;
  const sim::TrainerRankTime t = price(c);
  // Per layer and pass: 100 us on the curve + 200 us + 2e6 bytes x 0.5 ns; 3 passes, 2 layers.
  EXPECT_NEAR(t.exchange, 2 * 3 * (1e-4 + 200e-6 + 2e6 * 0.5e-9), 1e-12);
  // Every attention call pays its fixed cost: 3 calls per layer, local or CAD.
  EXPECT_NEAR(t.attention, 2 * (0.045 + 3 * 1e-3), 1e-12);
  EXPECT_NEAR(price(c, false).attention, 2 * (0.045 + 3 * 1e-3), 1e-12);
  // The attention scale multiplies the kernels only.
  c.attention_scale = 2;
  EXPECT_NEAR(price(c).attention, 2 * (0.090 + 3 * 1e-3), 1e-12);
}

TEST(SimulateTrainer, PingPongHidesAtMostTheOverlap) {
  sim::TrainerCalibration c = zero();
  c.layer_us_per_token = 10;  // 10 ms per layer
  c.head_us_per_token = 3;    // 3 ms
  // An exchange shorter than the compute (hidden whole) and one longer (hidden up to the compute).
  for (const double fixed_us : {0.0, 100000.0}) for (const double factor : {1.0, 1.1, 1.5}) {
    c.exchange_fixed_us = fixed_us;
    c.pingpong_compute_factor = factor;
    const sim::TrainerRankTime off = price(c);
    const sim::TrainerRankTime on = price(c, true, true);
    const double compute = 2 * (0.010 + 0.045);  // the layers' compute, without ping-pong
    // Hidden at most min(exchange, slowed compute): never below either of them.
    EXPECT_GE(on.total + 1e-12, 0.003 + factor * compute);
    EXPECT_GE(on.total + 1e-12, 0.003 + on.exchange);
    EXPECT_NEAR(on.exchange_exposed, std::max(0.0, on.exchange - factor * compute), 1e-12);
    EXPECT_NEAR(on.total, 0.003 + std::max(factor * compute, on.exchange) + on.plan, 1e-12);
    EXPECT_NEAR(off.exchange_exposed, off.exchange, 1e-12);
    if (fixed_us == 0) {
      EXPECT_DOUBLE_EQ(on.exchange_exposed, 0);
    } else {
      EXPECT_GT(on.exchange_exposed, 0);
    }
  }
  c.exchange_fixed_us = 0;
  // Colocated has nothing to hide: ping-pong is priced as no ping-pong (and its factor does not apply).
  c.pingpong_compute_factor = 1.5;
  EXPECT_DOUBLE_EQ(price(c, false, true).total, price(c, false, false).total);
}

TEST(SimulateTrainer, StepGrowsWithEveryOverheadTerm) {
  const sim::TrainerCalibration base = [] {
    sim::TrainerCalibration c = zero();
    c.layer_us_per_token = 1;
    c.head_us_per_token = 1;
    c.plan_make_ms = 1;
    c.plan_make_us_per_task = 1;
    c.plan_make_ns_per_token = 1;
    c.exchange_fixed_us = 1;
    c.pack_unpack_ns_per_byte = 0.01;
    c.attention_call_us = 1;
    c.pingpong_compute_factor = 1.05;
    return c;
  }();
  double sim::TrainerCalibration::*terms[] = {
      &sim::TrainerCalibration::layer_us_per_token,    &sim::TrainerCalibration::head_us_per_token,
      &sim::TrainerCalibration::plan_make_ms,          &sim::TrainerCalibration::plan_make_us_per_task,
      &sim::TrainerCalibration::plan_make_ns_per_token, &sim::TrainerCalibration::exchange_fixed_us,
      &sim::TrainerCalibration::pack_unpack_ns_per_byte, &sim::TrainerCalibration::attention_call_us,
      &sim::TrainerCalibration::attention_scale,       &sim::TrainerCalibration::pingpong_compute_factor};
  for (auto term : terms) {
    for (const bool pingpong : {false, true}) {
      sim::TrainerCalibration more = base;
      more.*term *= 2;
      EXPECT_GE(price(more, true, pingpong).total, price(base, true, pingpong).total);
    }
    // Without ping-pong every term that applies to a CAD rank adds time.
    if (term != &sim::TrainerCalibration::pingpong_compute_factor) {
      sim::TrainerCalibration more = base;
      more.*term *= 2;
      EXPECT_GT(price(more).total, price(base).total);
    }
  }
  sim::TrainerCalibration more = base;
  more.step_fixed_ms = 3;
  EXPECT_GT(sim::trainer_step_seconds({{1.0}}, more), sim::trainer_step_seconds({{1.0}}, base));
}

TEST(SimulateTrainer, CalibrationFileRefusals) {
  const sim::TrainerCalibration c = sim::parse_trainer_calibration(kValid, "t.json");
  EXPECT_DOUBLE_EQ(c.plan_make_us_per_task, 90);
  EXPECT_EQ(c.fitted_on, "run9");
  EXPECT_EQ(c.source.at("layer_us_per_token"), "fit");
  std::string missing = kValid;
  missing.replace(missing.find("\"layer_us_per_token\": 3,"), 24, "");
  EXPECT_NE(refusal(missing).find("t.json: key 'layer_us_per_token' is missing"), std::string::npos) << refusal(missing);
  EXPECT_NE(refusal(with("pack_unpack_ns_per_byte", "-1")).find("key 'pack_unpack_ns_per_byte' must be a number >= 0"),
            std::string::npos);
  EXPECT_NE(refusal(with("attention_scale", "0")).find("key 'attention_scale' must be a number > 0"),
            std::string::npos);
  EXPECT_NE(refusal(with("pingpong_compute_factor", "0.9")).find("'pingpong_compute_factor' must be a number >= 1"),
            std::string::npos);
  EXPECT_NE(refusal(with("fitted_on", "[]")).find("key 'fitted_on' must be a non-empty list"), std::string::npos);
  EXPECT_NE(refusal("[1]").find("t.json: expected a JSON object"), std::string::npos);
  EXPECT_THROW(sim::load_trainer_calibration("/nonexistent/trainer.json"), std::invalid_argument);
}

TEST(SimulateTrainer, BatchSeedsPriceExactlyTheNamedBatches) {
  sim::Scenario s;
  s.shape = sim::model_preset("llama-8b");
  s.shape.layers = 2;
  s.layout = sim::Layout{2, 2, 1, 1};
  for (int i = 0; i < 300; ++i) s.lengths.push_back(500 + (i * 7919) % 9000);
  for (int i = 0; i < 6; ++i) s.lengths.push_back(65536 + i * 1000);
  s.context = 32768;
  for (const char* n : {"colocated", "prefix_aware"}) {
    sim::BalancerSpec b;
    b.name = n;
    b.group_size = std::string(n) == "colocated" ? 1 : 0;
    s.balancers.push_back(b);
  }
  s.search_path = CAD_BALANCER_PLUGIN_DIR;
  s.microbatches = 2;
  sim::TrainerCalibration c = zero();
  c.layer_us_per_token = 3;
  c.plan_make_ms = 5;
  s.trainer = &c;
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});

  // Seeds 7,8 are --seed 7 --steps 1; seeds 8,7 are the same step with its micro-batches swapped.
  s.seed = 7;
  s.detail = true;
  const auto by_seed = sim::simulate(s, cal, *rates);
  s.batch_seeds = {8, 7};
  const auto named = sim::simulate(s, cal, *rates);
  for (size_t b = 0; b < named.size(); ++b) {
    EXPECT_NEAR(named[b].off.mean_step_seconds, by_seed[b].off.mean_step_seconds, 1e-12);
    ASSERT_EQ(named[b].detail.size(), 2u);
    EXPECT_EQ(named[b].detail[0].seed, 8u);
    EXPECT_NEAR(named[b].detail[0].ranks[1].attention_fwd_s, by_seed[b].detail[1].ranks[1].attention_fwd_s, 1e-15);
  }
  // Colocated: each micro-batch waits for its slowest rank (FSDP2), whose time is the hand formula.
  const auto& col = named[0];
  double step = 0;
  for (const auto& mb : col.detail) {
    double slowest = 0;
    for (const auto& r : mb.ranks) {
      slowest = std::max(slowest, 2 * (32768 * 3e-6 + 2 * r.attention_fwd_s + r.attention_bwd_s));
    }
    step += slowest;
  }
  EXPECT_NEAR(col.off.mean_step_seconds, step, 1e-9);
  // prefix_aware makes one plan per micro-batch (5 ms each).
  EXPECT_NEAR(named[1].detail[0].ranks[0].trainer_off.plan, 5e-3, 1e-12);

  s.batch_seeds = {1, 2, 3};
  EXPECT_THROW(sim::simulate(s, cal, *rates), std::invalid_argument);
  s.batch_seeds.clear();
  s.layout = sim::Layout{4, 4, 1, 2};
  EXPECT_THROW(sim::simulate(s, cal, *rates), std::invalid_argument);
}

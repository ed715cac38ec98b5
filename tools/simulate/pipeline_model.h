// pipeline_model.h -- the pipeline trainer (examples/train_pipeline.py) as `cad simulate --schedule gpipe` and
// `--schedule 1f1b_ticks` price it: PP stages x DP replicas (rank = stage x DP + replica), M micro-batches per
// step, the trainer calibration's terms (trainer_calibration.h) split by tick.
//
// GPipe schedule: T = M + PP - 1 forward ticks, then T backward ticks. At forward tick t stage s runs
// micro-batch t - s (idle outside [0, M)); backward tick b mirrors forward tick T - 1 - b (the last micro-batch
// first).
//
// One stage-tick of a rank with n tokens, its layers l = L / PP, P = 1 + (full checkpointing):
//   non-attention per layer: n x layer_us_per_token / 4 in a forward tick, n x layer_us_per_token x (P + 1)
//     / 4 in a backward tick -- layer_us_per_token was fitted on the data-parallel trainer with full
//     checkpointing: a layer's forward, recomputed forward and backward (a backward is 2 forwards' GEMMs), 4
//     forward units; the forward tick runs 1, the backward tick the recomputation and the backward (3; 2
//     without checkpointing)
//   head (last stage only, when it runs a micro-batch): n x head_us_per_token, 1/4 in the forward tick and
//     3/4 in the backward (the trainer's chunked loss recomputes the logits in the backward: forward,
//     recomputation, backward = 2 GEMMs, as a checkpointed layer); the embedding (stage 0) is a lookup and its
//     gradient a scatter-add, taken as 0 (the calibration has no separate term for it)
//   attention per layer: kernel_scale x (the direction's kernel seconds) + calls x attention_call_us, calls
//     = 1 forward, P backward (the recomputed forward and the backward)
//   exchange per layer (CAD moving work): passes x (curve(bytes) + exchange_fixed_us + bytes x pack_unpack)
// Plans are made ahead on CAD's planning thread (run 17: 0 ms of plan wait), so plan make is not counted.
//
// Tick time, by how attention is pooled:
//   local  (colocated; or --pool stage with DP = 1, which moves nothing): ranks are independent within a
//          tick and meet only at the send/recv between ticks: tick = max over ranks of
//          l x (non-attention + attention) + head
//   stage  (CAD within each stage's DP ranks): the same, each rank's attention being what its stage's plan
//          gives it, plus the exchange
//   tick   (one CAD group over every rank, one plan per tick over the documents the stages hold then; idle
//          ranks hold none but serve): every attention call is collective over all stages, so they move in
//          lockstep through their layers: tick = l x (max over ranks of non-attention + max over ranks of
//          attention + exchange) + head (the other stages wait for the head at the next tick's first call)
//   bubble (GPipe; train_pipeline.py --pool bubble): tick pooling in the fill and drain ticks (some stage
//          idle, its ranks serving) and their mirrored backward ticks, local attention in the others (every
//          stage busy: no plan, no CAD call), each tick priced as its pool says (1F1B: see below)
// Step = sum over the 2T ticks + step_fixed_ms; with local attention each replica's stages are a pipeline of
// their own (nothing couples replicas before the step's gradient all-reduce), so the step is the slowest
// replica's sum of its ticks (each tick priced over that replica's stages); under --pool bubble the replicas
// run so between the pooled ticks, whose calls they all join (pipeline_driver.h StepClock). Ping-pong is not
// modelled for this schedule (priced as off).
//
// 1F1B (train_pipeline.py --schedule 1f1b, priced by --schedule 1f1b_ticks): the timetable
// one_f_one_b_schedule gives, per tick, each stage's operation -- the forward or the backward of one
// micro-batch, or nothing -- so one tick mixes directions. Plans: one per (micro-batch m, stage s), used by
// that stage's forward of m and its backward of m: under --pool tick over every rank, only stage s's ranks
// holding documents (replica r holds buffer r of m); under --pool stage over the stage's DP replicas;
// colocated local. A rank's own operation costs what it costs in GPipe (non-attention 1 or P + 1 units, the
// head's 1/4 or 3/4 on the last stage); each operation makes, per layer, its calls: a forward one forward call,
// a backward P calls (the recomputed forward, then the backward).
//   tick pooling: every rank makes every stage's calls of the tick in stage order (cad.CallOrder), its own
//          with its tokens and the others' as a server, so each call is collective over all ranks: a call
//          waits for its slowest server. tick = l x (max over ranks of non-attention + sum over the calls of
//          max over ranks of (that call's attention + exchange)) + max head. A rank's attention in a call is
//          its server share of that call's plan in the call's direction, + attention_call_us.
//          The step is the sum over its ticks (2 (M + PP - 1) of them) + step_fixed_ms.
//   local / stage: a rank makes only its own operation's calls, so the stages meet only at the batched
//          send/recv at a tick's end (exchange_1f1b), and only where something is sent: stages s and s + 1 meet
//          at the end of tick t when s runs a forward there (it sends the activation) or s + 1 a backward (it
//          sends the gradient); each then posts the matching receive. At every other tick neither waits for
//          the other. In PP = 2's mixed ticks (stage 0 backward, stage 1 forward: ticks 3, 5, 7 at M = 4) nothing
//          is sent (the first stage's backward has no one to send to, the last stage's forward ends in the
//          loss), so stage 1 runs its forward and the backward of the next tick back to back while stage 0 runs
//          its backward and its next forward. The step is therefore not a sum of per-tick maxima:
//          OneFOneBClocks keeps one clock per rank, advances it by the rank's own time in the tick (l x
//          (non-attention + attention + exchange) + head; under --pool stage a stage's replicas, which meet at
//          every call of their plan, start together and end with the slowest) and, at a tick's end, sets both
//          ranks of each pair that exchanges to the later of their two ends. Step = the last rank's end +
//          step_fixed_ms. (Pricing each tick as its slowest rank and summing, the first version of this model,
//          over-predicted run 25's 1F1B local step by 12%: tick by tick the ranks' own times were within a few
//          percent, but stage 0's long backwards and stage 1's long backwards fell in different ticks and were
//          both counted in full.) The send itself (an activation of n x hidden values) is not priced, as in
//          GPipe. This replaces GPipe's per-replica pipelines: an exchange couples only (s, r) and (s + 1, r).
//   bubble (train_pipeline.py --schedule 1f1b --pool bubble, full checkpointing only): tick pooling in the ticks
//          where some stage is idle (one_f_one_b_bubble_tick; M = 4, PP = 2: ticks 0 [F0,-], 2 [-,B0], 8 [-,B3],
//          9 [B3,-]), local attention in the others. A bubble tick is priced exactly as tick pooling prices it
//          (each operation with its (micro-batch, stage) plan over every rank, only its stage's ranks holding
//          documents), a steady tick exactly as local. A micro-batch's forward and backward on a stage can fall
//          one in a bubble tick and the other in a steady one; with full checkpointing the backward recomputes
//          its forward under its own tick's attention, so each operation only needs its own tick's plan (and the
//          trainer refuses --pool bubble without it). Step: OneFOneBClocks in the steady ticks (the stages
//          meeting only where they send); at a bubble tick every rank meets at its calls: every rank starts the
//          tick at the latest of all ranks' clocks and all end together, start + the tick's pooled seconds
//          (OneFOneBClocks::add_pooled), so the send at its end is already consistent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "step_model.h"
#include "system_calibration.h"
#include "trainer_calibration.h"
#include "trainer_model.h"

namespace cad::simulate {

// kBubble: kTick in the ticks where some stage is idle, kLocal in the others (gpipe_bubble_tick,
// one_f_one_b_bubble_tick). kBubbleStage (GPipe only; a prediction: the trainer has no such pool yet): kTick in
// the bubble ticks, kStage (CAD within each stage's data-parallel replicas) in the others -- what pooling per
// tick wins in the fill and drain, and what pooling per stage wins where DP > 1, without coupling the stages at
// every call in the steady ticks.
enum class PipelinePool { kLocal, kStage, kTick, kBubble, kBubbleStage };

// One tick of the GPipe schedule: which micro-batch each stage runs (-1: idle).
struct GpipeTick {
  bool backward = false;
  int64_t index = 0;  // tick within its phase, 0..T-1
  std::vector<int64_t> micro_batch;  // per stage
};

// The 2 (M + PP - 1) ticks of one step, forward ticks first. Throws std::invalid_argument for stages < 1 or
// micro-batches < 1.
std::vector<GpipeTick> gpipe_schedule(int64_t stages, int64_t microbatches);

// Whether some stage is idle at GPipe forward tick `forward_tick` (t < PP - 1: the fill; t >= M: the drain), as
// train_pipeline.py bubble_tick: the ticks, and their mirrored backward ticks, that --pool bubble pools.
bool gpipe_bubble_tick(int64_t stages, int64_t microbatches, int64_t forward_tick);

// The pool a GPipe tick is priced with: `pool`, except under kBubble kTick in a bubble tick and kLocal in a
// steady one (every stage busy: the trainer runs local attention there, no plan and no CAD call), and under
// kBubbleStage kTick in a bubble tick and kStage in a steady one.
PipelinePool gpipe_tick_pool(PipelinePool pool, int64_t stages, int64_t microbatches, int64_t forward_tick);

// One stage's operation in one tick of the 1F1B timetable.
struct StageOp {
  bool backward = false;
  int64_t micro_batch = -1;  // -1: idle
};

// The 1F1B timetable of one step (train_pipeline.py one_f_one_b): per tick, per stage its operation. Stage s
// runs min(S - s - 1, M) warm-up forwards, then a forward and a backward in turn, then its remaining backwards;
// each operation takes the first tick at which what it needs was done at an earlier tick (a tick's outputs
// travel at its end): forward m on s needs forward m on s - 1, backward m on s needs backward m on s + 1 (on the
// last stage its own forward m). Throws std::invalid_argument for stages < 1 or micro-batches < 1.
std::vector<std::vector<StageOp>> one_f_one_b_schedule(int64_t stages, int64_t microbatches);

// Whether some stage is idle in this 1F1B tick (`ops`: one_f_one_b_schedule's row), as train_pipeline.py's 1F1B
// --pool bubble decides which ticks it pools: with PP = 1 none is. Throws std::invalid_argument for no stage.
bool one_f_one_b_bubble_tick(const std::vector<StageOp>& ops);

// The pool a 1F1B tick is priced with: `pool`, except under kBubble kTick in a bubble tick and kLocal in a
// steady one (every stage busy: local attention, no plan, no CAD call).
PipelinePool one_f_one_b_tick_pool(PipelinePool pool, const std::vector<StageOp>& ops);

// What one rank does in one tick, per layer of its stage (seconds), and its head.
struct TickRankTime {
  int64_t tokens = 0;
  double non_attention = 0;  // per layer
  double attention = 0;      // per layer, kernels and calls
  double exchange = 0;       // per layer
  double head = 0;           // once, last stage only
  double total = 0;          // per layer: non-attention + attention + exchange (the rank alone)
  double kernel = 0;         // per layer: the kernel seconds of the calls it joins (the rate table's, unscaled)
};

// One attention call of one rank, per layer: the kernel seconds of the shards it serves in the call's
// direction, its attention (kernel_scale x those + attention_call_us) and, when the plan moves work, one
// exchange pass.
struct CallTime {
  double kernel = 0;
  double attention = 0;
  double exchange = 0;
};
CallTime call_time(const RankWork& work, bool backward, bool moves_work, const SystemCalibration& cal,
                   const TrainerCalibration& tcal, const TrainerOptions& options);

// The attention calls one operation makes per layer, in order (true: a backward call): a forward's one forward
// call; a backward's recomputed forward (with full checkpointing) and its backward call.
std::vector<bool> op_calls(bool backward, const TrainerOptions& options);

// A rank's own operation over `tokens` without its attention: non-attention per layer and, on the last stage,
// the head (see above).
TickRankTime op_time(int64_t tokens, bool backward, bool last_stage, const TrainerCalibration& tcal,
                     const TrainerOptions& options);

// `work`: the rank's tokens and the shards it serves (one layer); `joins_calls`: it makes this tick's
// attention calls (it runs a micro-batch, or it serves under tick pooling); `moves_work`: the plan ships work
// (pays the exchange); `last_stage`: pays the head when it runs a micro-batch.
TickRankTime tick_rank_time(const RankWork& work, bool backward, bool joins_calls, bool moves_work, bool last_stage,
                            const SystemCalibration& cal, const TrainerCalibration& tcal,
                            const TrainerOptions& options);

// One tick along its critical path, by part (seconds; tp_comm and plan 0): linear = non-attention and head,
// attention = the calls' attention, comm = the exchange (under tick pooling: the rest of the calls' time, the
// slowest server's exchange and its wait), total = the tick's seconds. `ranks` stage-major (rank = stage x DP +
// replica); `calls[c][r]`: rank r's part of the tick's c-th collective call (used under tick pooling, where
// each call waits for its slowest server; GPipe's calls of a tick all belong to one plan and are taken as one).
RankTime tick_critical_path(const std::vector<TickRankTime>& ranks, const std::vector<std::vector<CallTime>>& calls,
                            int64_t layers_per_stage, PipelinePool pool);

// One GPipe tick from its ranks and the stage's layer count: tick_critical_path with each rank's calls taken as
// one (they are all one plan's, in one direction); tick_seconds is its total.
RankTime gpipe_tick_critical_path(const std::vector<TickRankTime>& ranks, int64_t layers_per_stage,
                                  PipelinePool pool);
double tick_seconds(const std::vector<TickRankTime>& ranks, int64_t layers_per_stage, PipelinePool pool);

// Whether stages s and s + 1 send to each other at the end of a 1F1B tick (train_pipeline.py exchange_1f1b):
// s sends its forward's activation or s + 1 its backward's gradient (and the other posts the receive).
bool stages_exchange(const std::vector<StageOp>& ops, int64_t stage);

// The clocks of a 1F1B step whose stages meet only at their send/recv: local attention and --pool stage (see
// above), and --pool bubble, whose steady ticks are local and whose bubble ticks meet every rank (add_pooled).
// Not for --pool tick, whose calls meet at every layer (its step is the sum of its ticks).
class OneFOneBClocks {
 public:
  // Throws std::invalid_argument for pool kTick, stages or dp < 1, or layers_per_stage < 1.
  OneFOneBClocks(PipelinePool pool, int64_t stages, int64_t dp, int64_t layers_per_stage);
  // One tick where the stages meet only where they send: `ops` per stage, `ranks` stage-major (rank = stage x
  // DP + replica), as one_f_one_b_tick prices them (under kBubble: a steady tick, priced as local). Each rank
  // that runs an operation moves on by its own time (layers x total + head; under kStage its stage's replicas
  // start at the latest of their clocks and take the slowest one's time); then each pair (s, r), (s + 1, r)
  // that exchanges (stages_exchange) ends at the later of the two. Under kBubble a bubble tick is refused (it
  // goes to add_pooled).
  void add(const std::vector<StageOp>& ops, const std::vector<TickRankTime>& ranks);
  // Under kBubble, one bubble tick priced under tick pooling (`tick_seconds`: one_f_one_b_tick's critical
  // total): every rank starts it at the latest clock of all and all end together at start + tick_seconds.
  // Throws std::invalid_argument under another pool.
  void add_pooled(double tick_seconds);
  // Per rank, seconds from the step's start to the end of the last tick added (its send/recv included).
  const std::vector<double>& ends() const { return clock_; }
  // The step's ticks: the last rank's end.
  double seconds() const;

 private:
  PipelinePool pool_;
  int64_t stages_, dp_, layers_;
  std::vector<double> clock_;
};

// One 1F1B tick priced: every rank's own operation and the calls it joins, and the tick's critical path.
struct PricedTick {
  std::vector<TickRankTime> ranks;  // stage-major
  RankTime critical;                // critical.total: the tick's seconds
};
// `ops`: per stage its operation; `plans[m x stages + s]`: every rank's work (stage-major) in the plan of
// micro-batch m on stage s -- under tick pooling over every rank, else only stage s's ranks have any (the
// others' entries are empty). A rank's tokens are its entry in its own operation's plan.
PricedTick one_f_one_b_tick(const std::vector<StageOp>& ops, const std::vector<std::vector<RankWork>>& plans,
                            int64_t dp, int64_t layers_per_stage, PipelinePool pool, const SystemCalibration& cal,
                            const TrainerCalibration& tcal, const TrainerOptions& options);

}  // namespace cad::simulate

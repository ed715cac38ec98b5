// simulation.h -- the whole `cad simulate` run: sample batches with the DistCA recipe, plan each with
// every balancer plugin (in its balancing groups), price every rank with the step model, and collect
// step times with and without ping-pong. A document the packing cuts at a buffer's end goes on as a new
// document in the next buffer (plan_work.h: documents_per_rank), for every balancer alike: all of them
// then compute the same attention FLOPs and differ only in where. With Scenario::max_doc_len (long
// documents) the documents are laid whole over the ranks instead, as cad.pack_documents lays them, their
// pieces spanning ranks, and cut only at the edges of Scenario::document_group.
//
// Tensor parallelism is priced as it runs (tensor_slices.h): each TP index runs CAD over its data group on
// its head slice, with the same plan; the plan is made once per group and micro-batch with the slice's cost,
// and every byte and second below is one GPU's, i.e. one TP index's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attention_rates.h"
#include "layout.h"
#include "model_shape.h"
#include "pipeline_model.h"
#include "plan_model.h"
#include "step_model.h"
#include "system_calibration.h"
#include "trainer_calibration.h"
#include "trainer_model.h"

namespace cad::simulate {

struct BalancerSpec {
  std::string name;           // plugin name or path
  std::string config = "{}";  // its JSON config
  // Data-parallel ranks that plan (and exchange work) together; 0 = all of them. Groups are
  // [g*size, (g+1)*size).
  int64_t group_size = 0;
  // The balancer's plan is also the token layout (per-document context parallelism): ranks then hold
  // their own chunks and only K/V moves.
  bool plan_is_layout = false;
};

// How a step with pp > 1 runs: k1f1b is the kernel-level model's 1F1B (step_model.h); kGpipe and k1f1bTicks
// the pipeline trainer (examples/train_pipeline.py, --schedule gpipe and 1f1b) tick by tick with the trainer
// calibration (pipeline_model.h).
enum class Schedule { k1f1b, kGpipe, k1f1bTicks };

// Why --pool bubble with --schedule 1f1b_ticks is refused without full checkpointing (the command says it too).
inline constexpr const char* kBubbleStageNeedsGpipe =
    "--pool bubble_stage is modelled for --schedule gpipe only (1F1B's steady ticks mix directions; not modelled)";
inline constexpr const char* kBubble1f1bNeedsCheckpointing =
    "--pool bubble with --schedule 1f1b_ticks needs --checkpointing full: a micro-batch's forward and backward on a "
    "stage can fall one in a bubble tick (CAD over every rank) and the other in a steady tick (local attention), "
    "so the backward must recompute its forward under its own tick's attention (train_pipeline.py --schedule 1f1b "
    "--pool bubble needs it too)";

// The schedule's --schedule name: "1f1b", "gpipe", "1f1b_ticks".
const char* schedule_name(Schedule schedule);
// Whether it prices the pipeline trainer tick by tick (gpipe, 1f1b_ticks): it then needs the trainer
// calibration and takes a PipelinePool.
bool is_trainer_pipeline(Schedule schedule);

struct Scenario {
  ModelShape shape;
  Layout layout;
  std::vector<int64_t> lengths;  // the document-length distribution
  int64_t context = 0;           // tokens per data-parallel rank and micro-batch
  std::vector<BalancerSpec> balancers;
  std::string search_path;
  uint64_t seed = 1;
  int64_t steps = 1;         // sampled steps
  int64_t microbatches = 1;  // per step (pipeline parallelism wants several)
  int64_t min_shard_tokens = 128;
  // The seed of every micro-batch, in order (step 0's micro-batches first); when set, `steps` is
  // batch_seeds.size() / microbatches and `seed` is not used. Prices exactly the batches a trainer ran
  // (examples/train_llama.py samples micro-batch m of step s with seed 1 + 1000 s + m).
  std::vector<uint64_t> batch_seeds;
  // A real trainer's step (trainer_model.h) instead of the kernel-level model, when set.
  const TrainerCalibration* trainer = nullptr;
  TrainerOptions trainer_options;
  Schedule schedule = Schedule::k1f1b;
  // With kGpipe or k1f1bTicks: how CAD balancers pool attention (colocated is always local); kLocal is not
  // valid here, kBubble with kGpipe, and with k1f1bTicks under full checkpointing only (as the trainer's
  // --pool bubble).
  PipelinePool pool = PipelinePool::kTick;
  // Long documents: when > 0, each micro-batch is DistCA's recipe with lengths scaled to max_doc_len, laid
  // whole over the data-parallel ranks at `context` tokens per rank (long_docs.h sample_long_batch), and cut
  // only at the edges of groups of document_group ranks (plan_work.h documents_within_groups). Every
  // balancer's group (colocated's too: it is then the all-gather-KV context parallelism over its group)
  // must be a multiple of document_group, and max_doc_len at most document_group x context.
  int64_t max_doc_len = 0;
  int64_t document_group = 0;
  // Keep each micro-batch's per-rank parts in BalancerResult::detail (small runs: one entry per rank).
  bool detail = false;
  // Called with a line of progress (e.g. "step 2/4: prefix_aware") on long runs; may be empty.
  std::function<void(const std::string&)> progress;
};

// Averages over all micro-batches of all steps, for one balancer and one ping-pong mode.
struct ModeResult {
  bool pingpong = false;
  std::vector<double> step_seconds;  // per sampled step
  double mean_step_seconds = 0;
  RankTime slowest;  // the slowest rank of each micro-batch, averaged
  RankTime mean;     // the mean over ranks, averaged
};

// One micro-batch on one rank, by part (Scenario::detail).
struct RankDetail {
  int64_t tokens = 0;
  int64_t tasks_served = 0;                          // tasks of its group's plan it serves
  double attention_fwd_s = 0, attention_bwd_s = 0;  // the rate table's kernel seconds, one layer, unscaled
  double bytes_sent = 0, bytes_received = 0;         // one exchange pass of one layer
  double bytes_sent_inter = 0;                       // of bytes_sent, to GPUs of other nodes
  int64_t kv_bytes = 0;                              // K/V the rank holds as a server (server_memory.h)
  int64_t memory_received = 0;                       // Q/K/V/O bytes other ranks send it
  double total_off_s = 0, total_on_s = 0;            // the rank's micro-batch, without / with ping-pong
  TrainerRankTime trainer_off, trainer_on;           // the trainer model's parts (with Scenario::trainer)
};
struct MicroBatchDetail {
  int64_t step = 0, micro_batch = 0;
  uint64_t seed = 0;
  int64_t tasks = 0;  // tasks of all groups' plans
  std::vector<RankDetail> ranks;
};

// One tick of a --schedule gpipe or 1f1b_ticks step (Scenario::detail): which micro-batch each stage runs,
// every rank's parts (rank = stage x DP + replica) and the tick's seconds.
struct TickDetail {
  int64_t step = 0;
  GpipeTick tick;              // 1f1b_ticks: index = the tick in the step, micro_batch per stage, backward unused
  std::vector<StageOp> ops;    // 1f1b_ticks: each stage's operation (empty for gpipe)
  std::vector<TickRankTime> ranks;
  double seconds = 0;
  int64_t plan_documents = 0;  // documents in the tick's plans (gpipe tick pooling: the union of the stages')
  // 1f1b_ticks, local, --pool stage and --pool bubble: each rank's clock (seconds from the step's start) after this tick's
  // send/recv (pipeline_model.h OneFOneBClocks); `seconds` is then the slowest rank's own time in the tick, and
  // the step is not the sum of the ticks' seconds. Empty otherwise.
  std::vector<double> rank_ends;
  // The pool the tick was priced with: the run's, or under --pool bubble kTick (a bubble tick) or kLocal;
  // colocated's is kLocal.
  PipelinePool pool = PipelinePool::kLocal;
};

struct BalancerResult {
  std::string name;
  int64_t group_size = 0;
  int64_t stage_group_size = 0;  // pipeline: the replicas a stage-pooled tick plans over (1: local)
  double attention_imbalance = 0;  // max / mean attention seconds over ranks, averaged over micro-batches
  double bytes_per_layer = 0;      // forward all_to_all_v bytes of one layer, all ranks, mean per micro-batch
  double plan_ms = 0;              // mean planning time per micro-batch (all groups)
  // bytes_per_layer split by where they go: to GPUs of the same node / of other nodes (sum of every rank's
  // sent bytes; Layout::node_of), and the most one GPU sends to other nodes; means per micro-batch.
  double bytes_intra_per_layer = 0, bytes_inter_per_layer = 0;
  double max_inter_sent_per_gpu = 0;
  // Memory per server (server_memory.h), the largest over servers and micro-batches: K/V rows and bytes
  // held (own and received, one copy per document) and the Q/K/V/O bytes received (what a cap bounds).
  int64_t max_kv_rows = 0, max_kv_bytes = 0, max_memory_received = 0;
  ModeResult off, on;              // without / with ping-pong
  std::vector<MicroBatchDetail> detail;  // with Scenario::detail
  std::vector<TickDetail> ticks;         // with Scenario::detail and Schedule::kGpipe or k1f1bTicks
};

// Sets every result's off/on mean_step_seconds, the mean of its step_seconds (each driver's last step).
void set_mean_step_seconds(std::vector<BalancerResult>& results);

// The batches' shape, the same for every balancer (means per micro-batch, widest span the largest).
struct BatchSummary {
  double documents = 0;       // documents per micro-batch (after the cuts at group edges)
  double cut_documents = 0;   // documents a group edge cut (long documents; 0 otherwise)
  int64_t widest_span = 0;    // most ranks one document lies on
  int64_t longest = 0;        // longest document, tokens
};

// Validates the scenario (throws std::invalid_argument naming the option), runs it, returns one result
// per balancer in the given order.
std::vector<BalancerResult> simulate(const Scenario& scenario, const SystemCalibration& calibration,
                                     const AttentionRates& rates, BatchSummary* summary = nullptr);

// The pieces of micro-batch `seed` over `ranks` data-parallel ranks as the scenario lays them (documents_per_rank
// of the recipe, or the long-document layout); `cut_documents` as documents_within_groups'.
cad::plan::RankPieces scenario_batch(const Scenario& scenario, int32_t ranks, uint64_t seed, int64_t* cut_documents);

}  // namespace cad::simulate

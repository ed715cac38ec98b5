// cad_kernels.h -- the CUDA kernels of the project, as plain C++ functions that take raw device
// pointers, sizes and a stream, enqueue work on that stream only, and return the launch's
// cudaError_t. Nothing here allocates: callers get the workspace size from a plan and lend the
// memory (the plugins take it from the host's allocate service).
//
// Tensors are compact row-major: Q, O, dO, dQ [Tq, Hq, D] bf16; K, V, dK, dV [Tk, Hkv, D] bf16;
// LSE [Hq, Tq] fp32. Head dims 64 and 128; Hq % Hkv == 0 (query head h reads KV head h / (Hq/Hkv)).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cad::kernels {

class HostStaging;  // host_staging.h: pinned buffers for uploads that never wait for their stream

// One segment of a server batch; the same layout as cad_segment_v1_t. Queries [q_offset, +q_len)
// attend to keys [kv_offset, +kv_len); causal masks are aligned bottom-right.
struct Segment {
  int64_t q_offset;
  int64_t q_len;
  int64_t kv_offset;
  int64_t kv_len;
};

struct AttentionProblem {
  int64_t tq = 0;  // rows of Q
  int64_t tk = 0;  // rows of K/V
  int hq = 0;
  int hkv = 0;
  int head_dim = 0;  // 64 or 128
  float softmax_scale = 0.f;
  bool causal = false;
  // Sliding window (ABI v1.2, PyTorch's window_size): query i of a segment, at key position p = i + kv_len -
  // q_len (bottom-right), sees keys [p - window_left, p + window_right]; -1 = no limit. The plans drop a window
  // that hides no key of their segments (window_hides_keys), which then runs exactly as the unwindowed problem;
  // one that hides any runs on the kernels `hopper` picks (all of them mask the window's edges).
  int32_t window_left = -1;
  int32_t window_right = -1;
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  // Use the Hopper (sm_90a, wgmma) kernels: forward and backward at D=64/128; only where
  // hopper_kernels_available() says so.
  bool hopper = false;
};

bool head_dim_supported(int head_dim);

// Does the problem's window hide any key from any query of these segments? Its last query (p = kv_len - 1)
// sees key 0 iff window_left >= kv_len - 1, and its first (p = kv_len - q_len) the last key iff window_right >=
// q_len - 1 (causal: window_right changes nothing), so a window hides nothing when every segment with queries
// and keys meets both. The one place the kernels' plans decide whether a windowed call needs the window mask.
bool window_hides_keys(const AttentionProblem& problem, const Segment* segments, int64_t num_segments);

// True when the current device is compute capability 9.0 and the sm_90a kernels of this build are
// the ones loaded for it.
bool hopper_kernels_available();

// ---- forward ---------------------------------------------------------------------------------------

// One forward work item (per query head): a tile of up to fwd_block_m() queries of one segment against
// keys [kv_begin, kv_end) of that segment. partial_slot < 0 writes O/LSE; otherwise the item is one
// split of the KV range and writes fp32 partial results that the combine kernel merges.
struct FwdItem {
  int64_t q_row;          // absolute row in Q/O of the tile's first query
  int64_t kv_row;         // absolute row in K/V of the segment's first key
  int32_t q_rows;         // valid queries in the tile
  int32_t q_index;        // index of the tile's first query inside its segment
  int32_t causal_offset;  // kv_len - q_len (causal or windowed, else 0): query i sees keys j <= i + causal_offset
  int32_t kv_begin;       // keys of this item, segment-relative
  int32_t kv_end;
  int32_t partial_slot;
};

// Merges the splits of one query tile: partial slots [first_slot, first_slot + num_slots).
struct CombineItem {
  int64_t q_row;
  int32_t q_rows;
  int32_t first_slot;
  int32_t num_slots;
  int32_t reserved;
};

// Rows [begin, end) of Q that no segment covers (their O is 0 and LSE -inf).
struct RowRange {
  int64_t begin;
  int64_t end;
};

constexpr int kFwdBlockM = 64;     // queries per forward work item (portable mma.sync kernel)
// Queries per forward work item of the Hopper wgmma kernel: 64 per consumer warpgroup. Head dim 64 runs three
// consumers (192 queries) by default: its products are half as long, so a third warpgroup's softmax is what keeps
// the tensor cores fed; -DCAD_FWD64_CONSUMERS=2 builds the two-consumer kernel (both the host and CUDA sources).
#ifndef CAD_FWD64_CONSUMERS
#define CAD_FWD64_CONSUMERS 3
#endif
static_assert(CAD_FWD64_CONSUMERS == 2 || CAD_FWD64_CONSUMERS == 3, "CAD_FWD64_CONSUMERS: 2 or 3");
constexpr int fwd90_consumers(int head_dim) { return head_dim == 64 ? CAD_FWD64_CONSUMERS : 2; }
constexpr int fwd_block_m90(int head_dim) { return 64 * fwd90_consumers(head_dim); }
constexpr int kFwdBlockN = 64;     // keys per K/V tile (portable kernel)
constexpr int kFwdBlockN90 = 128;  // keys per K/V tile (Hopper kernel)
inline int fwd_block_m(const AttentionProblem& p) { return p.hopper ? fwd_block_m90(p.head_dim) : kFwdBlockM; }
inline int fwd_block_n(const AttentionProblem& p) { return p.hopper ? kFwdBlockN90 : kFwdBlockN; }

struct ForwardPlan {
  AttentionProblem problem;
  std::vector<FwdItem> items;        // heaviest first
  std::vector<CombineItem> combines;
  std::vector<RowRange> uncovered;   // rows of Q outside every segment
  int32_t block_m = kFwdBlockM;      // queries per item (and per partial slot)
  int32_t num_slots = 0;
  // The Hopper kernel's persistent grid: at most this many blocks, one per SM (make_forward_plan's num_sms). Fewer
  // than the device's SMs leave some free for work beside it: a collective's kernel that must not wait for all of
  // this kernel's work (CAD's own tasks while their rows are in flight).
  int32_t max_blocks = 0;
  // The Hopper kernel's walk over its units: false, each block a fixed share (the default: what the planner's KV
  // split and `cad simulate` model); true, each block takes the next untaken unit (a counter in the workspace), so
  // that blocks which start late because a kernel beside this one holds their SM take fewer units. Set by the
  // caller after make_forward_plan.
  bool dynamic_walk = false;
  // Workspace layout (byte offsets into one buffer of workspace_bytes, 256-byte aligned).
  size_t items_offset = 0, combines_offset = 0, uncovered_offset = 0, partial_o_offset = 0,
         partial_lse_offset = 0, unit_counter_offset = 0, workspace_bytes = 0;
};

// Builds the work list on the host. `num_sms` (the device's multiprocessor count) decides how far
// long KV ranges are split so that the grid fills the GPU. Pure host code. The plan's `problem` is the one
// the kernels run: without the window when it hides no key (a window that hides some keeps `hopper`: the
// Hopper kernels mask windows).
ForwardPlan make_forward_plan(const AttentionProblem& problem, const Segment* segments, int64_t num_segments,
                              int num_sms);

// Enqueues the forward: copies the plan's tables into `workspace` (device memory of at least
// plan.workspace_bytes, usable in order on `stream`), then runs the kernels. Writes every row of O/LSE.
// staging: pinned buffers to copy the tables through, so that the copy never waits for `stream`
// (host_staging.h); null: straight from the plan's pageable memory.
cudaError_t attention_forward(const ForwardPlan& plan, const void* q, const void* k, const void* v, void* o,
                              float* lse, void* workspace, cudaStream_t stream, HostStaging* staging = nullptr);

// For a plan reused by many calls (a CAD plan, a captured CUDA graph): upload the tables once with
// upload_forward_tables, then run attention_forward_resident, which enqueues kernels only (no copy from
// host memory, so it is CUDA-graph capturable).
// staging: as attention_forward's.
cudaError_t upload_forward_tables(const ForwardPlan& plan, void* workspace, cudaStream_t stream,
                                  HostStaging* staging = nullptr);
cudaError_t attention_forward_resident(const ForwardPlan& plan, const void* q, const void* k, const void* v, void* o,
                                       float* lse, void* workspace, cudaStream_t stream);

// ---- backward --------------------------------------------------------------------------------------

// Keys per backward work item. Portable kernel: 16 per warp, 4 warps at D=64 and 8 at D=128 (twice the
// keys per dQ atomic, the backward's bottleneck, where registers allow only 32 queries per step). Hopper
// kernel: 128 at both head dims (two math warpgroups of 64 keys).
constexpr int bwd_warps(int head_dim) { return head_dim == 128 ? 8 : 4; }
constexpr int bwd_block_n(int head_dim) { return 16 * bwd_warps(head_dim); }
constexpr int kBwdBlockN90 = 128;
inline int bwd_block_n(const AttentionProblem& p) { return p.hopper ? kBwdBlockN90 : bwd_block_n(p.head_dim); }

// One backward work item (per KV head): keys [kv_begin, kv_begin + kv_rows) of one segment (kv_rows <=
// bwd_block_n(problem)) against all
// queries of that segment that see them, for every query head of the KV head's group.
struct BwdItem {
  int64_t q_row;          // absolute row in Q of the segment's first query
  int64_t kv_row;         // absolute row in K/V of the segment's first key
  int32_t q_len;
  int32_t causal_offset;  // kv_len - q_len (causal or windowed, else 0)
  int32_t kv_begin;       // first key of the tile, segment-relative
  int32_t kv_rows;        // valid keys in the tile
  int32_t q_begin;        // first query that sees any key of the tile (causal, window_right), else 0
  int32_t q_end;          // one past the last query that sees any key of the tile (window_left), else q_len
};

struct BackwardPlan {
  AttentionProblem problem;
  std::vector<BwdItem> items;          // heaviest first
  // true when no KV row is read by two segments: each (key tile, KV head) then belongs to one work
  // item, which writes dK/dV directly; otherwise items add into fp32 accumulators.
  bool kv_exclusive = true;
  std::vector<RowRange> unread_kv;     // rows of K/V no segment reads (kv_exclusive only)
  size_t items_offset = 0, delta_offset = 0, lse_log2_offset = 0, dq_acc_offset = 0, dk_acc_offset = 0,
         dv_acc_offset = 0, workspace_bytes = 0;
};

// The plan's `problem` is the one the kernels run: without the window when it hides no key.
BackwardPlan make_backward_plan(const AttentionProblem& problem, const Segment* segments, int64_t num_segments);

cudaError_t attention_backward(const BackwardPlan& plan, const void* q, const void* k, const void* v, const void* o,
                               const float* lse, const void* d_o, void* d_q, void* d_k, void* d_v,
                               void* workspace, cudaStream_t stream, HostStaging* staging = nullptr);
cudaError_t upload_backward_tables(const BackwardPlan& plan, void* workspace, cudaStream_t stream,
                                   HostStaging* staging = nullptr);
cudaError_t attention_backward_resident(const BackwardPlan& plan, const void* q, const void* k, const void* v,
                                        const void* o, const float* lse, const void* d_o, void* d_q, void* d_k,
                                        void* d_v, void* workspace, cudaStream_t stream);

}  // namespace cad::kernels

// fp32_reference.cu -- see fp32_reference.h.
//
// Every kernel works on 64 x 64 tiles with 256 threads: thread (ty, tx) = (tid / 16, tid % 16) owns the
// tile entries of rows ty + 16 r and columns tx + 16 c (r, c < 4), and, of a [64][D] result, rows
// ty + 16 r and columns 64 c + 4 tx .. + 3. Tiles of [64][D] sit in shared memory with a row stride of
// D + 4 floats (16-byte aligned float4 rows; consecutive rows start 4 banks apart, so the float4 reads
// of 8 different rows by a quarter-warp hit distinct banks). Scores go through shared memory with a
// row stride of 68. Rows of a tile beyond the valid ones are loaded as zeros and masked out
// explicitly, so no padding row ever contributes.
#include "fp32_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace cad::gpu_test {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 256;
constexpr int kScoreStride = kTile + 4;
constexpr size_t kScoreFloats = static_cast<size_t>(kTile) * kScoreStride;
template <int D>
__host__ __device__ constexpr size_t tile_floats() {
  return static_cast<size_t>(kTile) * (D + 4);
}

#define REF_TRY(expr)                         \
  do {                                        \
    const cudaError_t e_ = (expr);            \
    if (e_ != cudaSuccess) return e_;         \
  } while (0)

// What every kernel needs of the batch; `segments` is the device copy of the segment table.
struct Params {
  const cad_segment_v1_t* segments;
  int64_t tq;
  int64_t tk;
  int hq;
  int hkv;
  int group;  // hq / hkv
  float scale;
  bool causal;
};

// A tile of up to 64 queries of one segment (forward and dQ); kv_end: how many keys of the segment
// the tile's last query sees, i.e. the keys the tile must visit.
struct QueryTile {
  int32_t segment;
  int32_t q_begin;  // segment-relative
  int32_t q_rows;
  int32_t kv_end;
};

// Key rows [64 tile, 64 tile + 64) of K/V (absolute rows, whatever segments they belong to) and the
// segments that read any of them: segment_index[first, first + count), in increasing segment order.
struct KeyTile {
  int32_t tile;
  int32_t first;
  int32_t count;
  int32_t reserved;
};

__device__ __forceinline__ int64_t visible_keys(const cad_segment_v1_t& s, int64_t i, bool causal) {
  return causal ? i + 1 + (s.kv_len - s.q_len) : s.kv_len;
}

__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Loads `rows` rows, from `first_row` on, of head `head` of a [T, heads, D] tensor into a [64][D + 4]
// tile; the other rows of the tile become 0.
template <int D>
__device__ void load_tile(float* tile, const float* src, int64_t first_row, int rows, int heads, int head) {
  constexpr int kVec = D / 4;
  for (int idx = threadIdx.x; idx < kTile * kVec; idx += kThreads) {
    const int r = idx / kVec, c = idx % kVec;
    float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows) value = reinterpret_cast<const float4*>(src + ((first_row + r) * heads + head) * D)[c];
    reinterpret_cast<float4*>(tile + r * (D + 4))[c] = value;
  }
}

// acc[r][c] += dot(a row ty + 16 r, b row tx + 16 c) over D, for two [64][D + 4] tiles.
template <int D>
__device__ __forceinline__ void tile_dots(const float* a, const float* b, float acc[4][4]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll 2
  for (int e = 0; e < D; e += 4) {
    float4 x[4], y[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) x[r] = *reinterpret_cast<const float4*>(a + (ty + 16 * r) * (D + 4) + e);
#pragma unroll
    for (int c = 0; c < 4; ++c) y[c] = *reinterpret_cast<const float4*>(b + (tx + 16 * c) * (D + 4) + e);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        acc[r][c] = fmaf(x[r].x, y[c].x, acc[r][c]);
        acc[r][c] = fmaf(x[r].y, y[c].y, acc[r][c]);
        acc[r][c] = fmaf(x[r].z, y[c].z, acc[r][c]);
        acc[r][c] = fmaf(x[r].w, y[c].w, acc[r][c]);
      }
    }
  }
}

// acc[r][c][e] += sum_j w[ty + 16 r][j] * m[j][64 c + 4 tx + e]: a [64][64] weight tile (stride 68)
// times a [64][D + 4] tile.
template <int D>
__device__ __forceinline__ void tile_product(const float* w, const float* m, float acc[4][D / 64][4]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll 2
  for (int j = 0; j < kTile; j += 4) {
    float4 weights[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) weights[r] = *reinterpret_cast<const float4*>(w + (ty + 16 * r) * kScoreStride + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        const float4 x = *reinterpret_cast<const float4*>(m + (j + jj) * (D + 4) + 64 * c + 4 * tx);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float wr = component(weights[r], jj);
          acc[r][c][0] = fmaf(wr, x.x, acc[r][c][0]);
          acc[r][c][1] = fmaf(wr, x.y, acc[r][c][1]);
          acc[r][c][2] = fmaf(wr, x.z, acc[r][c][2]);
          acc[r][c][3] = fmaf(wr, x.w, acc[r][c][3]);
        }
      }
    }
  }
}

__device__ __forceinline__ void store_scores(float* buffer, const float s[4][4]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
#pragma unroll
    for (int c = 0; c < 4; ++c) buffer[(ty + 16 * r) * kScoreStride + tx + 16 * c] = s[r][c];
  }
}

// Max / sum over the 16 threads that share a row (lanes 0-15 or 16-31 of a warp).
__device__ __forceinline__ float row_max(float x) {
  for (int offset = 8; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
  for (int offset = 8; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Writes rows ty + 16 r < rows of a [64][D] register result, times `factor`, to rows first_row + ...
// of head `head` of a [T, heads, D] tensor.
template <int D>
__device__ void store_result(float* dst, int64_t first_row, int rows, int heads, int head, const float acc[4][D / 64][4],
                             float factor) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    if (ty + 16 * r >= rows) continue;
    float* row = dst + ((first_row + ty + 16 * r) * heads + head) * D;
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      *reinterpret_cast<float4*>(row + 64 * c + 4 * tx) =
          make_float4(factor * acc[r][c][0], factor * acc[r][c][1], factor * acc[r][c][2], factor * acc[r][c][3]);
    }
  }
}

// ---- forward: one block per (query tile, query head); online softmax over key tiles ------------------
template <int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Params p, const QueryTile* tiles, const float* q,
                                                           const float* k, const float* v, float* o, float* lse) {
  extern __shared__ float4 shared_f4[];
  float* qs = reinterpret_cast<float*>(shared_f4);
  float* ks = qs + tile_floats<D>();
  float* vs = ks + tile_floats<D>();
  float* ps = vs + tile_floats<D>();
  const QueryTile t = tiles[blockIdx.x];
  const int head = blockIdx.y, kv_head = head / p.group;
  const cad_segment_v1_t seg = p.segments[t.segment];
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  load_tile<D>(qs, q, seg.q_offset + t.q_begin, t.q_rows, p.hq, head);

  float row_m[4], row_l[4], acc[4][D / 64][4];
  int64_t visible[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    row_m[r] = -INFINITY;
    row_l[r] = 0.f;
    visible[r] = visible_keys(seg, t.q_begin + ty + 16 * r, p.causal);
#pragma unroll
    for (int c = 0; c < D / 64; ++c) acc[r][c][0] = acc[r][c][1] = acc[r][c][2] = acc[r][c][3] = 0.f;
  }
  for (int kb = 0; kb < t.kv_end; kb += kTile) {
    __syncthreads();  // the previous tile's readers are done with ks, vs, ps (and qs is loaded)
    load_tile<D>(ks, k, seg.kv_offset + kb, min(kTile, t.kv_end - kb), p.hkv, kv_head);
    load_tile<D>(vs, v, seg.kv_offset + kb, min(kTile, t.kv_end - kb), p.hkv, kv_head);
    __syncthreads();
    float s[4][4] = {};
    tile_dots<D>(qs, ks, s);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = kb + tx + 16 * c;
        s[r][c] = (j < t.kv_end && j < visible[r]) ? p.scale * s[r][c] : -INFINITY;
        tile_max = fmaxf(tile_max, s[r][c]);
      }
      const float m_new = fmaxf(row_m[r], row_max(tile_max));
      // Nothing seen yet (m_new = -inf): keep everything at zero rather than compute exp(-inf + inf).
      const float alpha = m_new == -INFINITY ? 1.f : expf(row_m[r] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[r][c] = s[r][c] == -INFINITY ? 0.f : expf(s[r][c] - m_new);
        sum += s[r][c];
      }
      row_l[r] = row_l[r] * alpha + row_sum(sum);
      row_m[r] = m_new;
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        for (int e = 0; e < 4; ++e) acc[r][c][e] *= alpha;
      }
    }
    store_scores(ps, s);
    __syncthreads();
    tile_product<D>(ps, vs, acc);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = ty + 16 * r;
    if (row >= t.q_rows) continue;
    const int64_t out_row = seg.q_offset + t.q_begin + row;
    float* dst = o + (out_row * p.hq + head) * D;
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
      if (row_l[r] > 0.f) {
        value = make_float4(acc[r][c][0] / row_l[r], acc[r][c][1] / row_l[r], acc[r][c][2] / row_l[r],
                            acc[r][c][3] / row_l[r]);
      }
      *reinterpret_cast<float4*>(dst + 64 * c + 4 * tx) = value;
    }
    if (tx == 0) lse[static_cast<int64_t>(head) * p.tq + out_row] = row_l[r] > 0.f ? row_m[r] + logf(row_l[r]) : -INFINITY;
  }
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

// delta[head][row] = dot(dO[row][head], O[row][head]); one warp per (row, head).
__global__ void delta_kernel(const float* o, const float* d_o, float* delta, int64_t tq, int hq, int d) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= tq * hq) return;
  const int64_t row = warp / hq;
  const int head = static_cast<int>(warp % hq);
  const float* a = o + warp * d;
  const float* b = d_o + warp * d;
  float sum = 0.f;
  for (int e = lane; e < d; e += 32) sum = fmaf(a[e], b[e], sum);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) delta[static_cast<int64_t>(head) * tq + row] = sum;
}

// ---- dQ: one block per (query tile, query head) ---------------------------------------------------------
// dQ_i = scale * sum_j dS_ij K_j, dS_ij = P_ij (dO_i . V_j - delta_i), P_ij = exp(scale Q_i . K_j - LSE_i).
template <int D>
__global__ void __launch_bounds__(kThreads) grad_q_kernel(Params p, const QueryTile* tiles, const float* q,
                                                          const float* k, const float* v, const float* lse,
                                                          const float* delta, const float* d_o, float* d_q) {
  extern __shared__ float4 shared_f4[];
  float* qs = reinterpret_cast<float*>(shared_f4);
  float* dos = qs + tile_floats<D>();
  float* ks = dos + tile_floats<D>();
  float* vs = ks + tile_floats<D>();
  float* ds = vs + tile_floats<D>();
  float* lse_s = ds + kScoreFloats;
  float* delta_s = lse_s + kTile;
  const QueryTile t = tiles[blockIdx.x];
  const int head = blockIdx.y, kv_head = head / p.group;
  const cad_segment_v1_t seg = p.segments[t.segment];
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t first_row = seg.q_offset + t.q_begin;
  load_tile<D>(qs, q, first_row, t.q_rows, p.hq, head);
  load_tile<D>(dos, d_o, first_row, t.q_rows, p.hq, head);
  if (threadIdx.x < kTile) {
    const bool valid = static_cast<int>(threadIdx.x) < t.q_rows;
    lse_s[threadIdx.x] = valid ? lse[static_cast<int64_t>(head) * p.tq + first_row + threadIdx.x] : 0.f;
    delta_s[threadIdx.x] = valid ? delta[static_cast<int64_t>(head) * p.tq + first_row + threadIdx.x] : 0.f;
  }
  float acc[4][D / 64][4] = {};
  int64_t visible[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) visible[r] = visible_keys(seg, t.q_begin + ty + 16 * r, p.causal);

  for (int kb = 0; kb < t.kv_end; kb += kTile) {
    __syncthreads();
    load_tile<D>(ks, k, seg.kv_offset + kb, min(kTile, t.kv_end - kb), p.hkv, kv_head);
    load_tile<D>(vs, v, seg.kv_offset + kb, min(kTile, t.kv_end - kb), p.hkv, kv_head);
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};
    tile_dots<D>(qs, ks, s);
    tile_dots<D>(dos, vs, dp);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = ty + 16 * r;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = kb + tx + 16 * c;
        const bool valid = row < t.q_rows && j < t.kv_end && j < visible[r];
        const float prob = valid ? expf(p.scale * s[r][c] - lse_s[row]) : 0.f;
        s[r][c] = valid ? prob * (dp[r][c] - delta_s[row]) : 0.f;
      }
    }
    store_scores(ds, s);
    __syncthreads();
    tile_product<D>(ds, ks, acc);
  }
  store_result<D>(d_q, first_row, t.q_rows, p.hq, head, acc, p.scale);
}

// ---- dK, dV: one block per (key tile, KV head) ------------------------------------------------------------
// dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i dS_ij Q_i over every segment reading key j (in segment
// order), every query head of the KV head's group (in head order) and every query that sees j.
template <int D>
__global__ void __launch_bounds__(kThreads) grad_kv_kernel(Params p, const KeyTile* tiles, const int32_t* segment_index,
                                                           const float* q, const float* k, const float* v,
                                                           const float* lse, const float* delta, const float* d_o,
                                                           float* d_k, float* d_v) {
  extern __shared__ float4 shared_f4[];
  float* ks = reinterpret_cast<float*>(shared_f4);
  float* vs = ks + tile_floats<D>();
  float* qs = vs + tile_floats<D>();
  float* dos = qs + tile_floats<D>();
  float* buffer = dos + tile_floats<D>();
  float* lse_s = buffer + kScoreFloats;
  float* delta_s = lse_s + kTile;
  const KeyTile t = tiles[blockIdx.x];
  const int kv_head = blockIdx.y;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t k0 = static_cast<int64_t>(t.tile) * kTile;
  const int key_rows = static_cast<int>(min(static_cast<int64_t>(kTile), p.tk - k0));
  load_tile<D>(ks, k, k0, key_rows, p.hkv, kv_head);
  load_tile<D>(vs, v, k0, key_rows, p.hkv, kv_head);
  float acc_k[4][D / 64][4] = {}, acc_v[4][D / 64][4] = {};

  for (int n = 0; n < t.count; ++n) {
    const cad_segment_v1_t seg = p.segments[segment_index[t.first + n]];
    const int64_t lo = max(k0, seg.kv_offset) - seg.kv_offset;  // first key of the tile in the segment
    const int64_t q_first = p.causal ? max(int64_t{0}, lo - (seg.kv_len - seg.q_len)) : 0;
    int64_t key[4];  // this thread's key rows, segment-relative (may be outside [0, kv_len))
#pragma unroll
    for (int r = 0; r < 4; ++r) key[r] = k0 + ty + 16 * r - seg.kv_offset;
    for (int head = kv_head * p.group; head < (kv_head + 1) * p.group; ++head) {
      for (int64_t qb = q_first; qb < seg.q_len; qb += kTile) {
        const int rows = static_cast<int>(min(static_cast<int64_t>(kTile), seg.q_len - qb));
        const int64_t first_row = seg.q_offset + qb;
        __syncthreads();  // the previous step is done with qs, dos, buffer, lse_s, delta_s (and ks, vs loaded)
        load_tile<D>(qs, q, first_row, rows, p.hq, head);
        load_tile<D>(dos, d_o, first_row, rows, p.hq, head);
        if (threadIdx.x < kTile) {
          const bool valid = static_cast<int>(threadIdx.x) < rows;
          lse_s[threadIdx.x] = valid ? lse[static_cast<int64_t>(head) * p.tq + first_row + threadIdx.x] : 0.f;
          delta_s[threadIdx.x] = valid ? delta[static_cast<int64_t>(head) * p.tq + first_row + threadIdx.x] : 0.f;
        }
        __syncthreads();
        float prob[4][4] = {}, dscore[4][4] = {};  // [key][query]: S^T, then P^T; dP^T, then dS^T
        tile_dots<D>(ks, qs, prob);
        tile_dots<D>(vs, dos, dscore);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int col = tx + 16 * c;
            const bool valid = col < rows && key[r] >= 0 && key[r] < seg.kv_len &&
                               key[r] < visible_keys(seg, qb + col, p.causal);
            const float pr = valid ? expf(p.scale * prob[r][c] - lse_s[col]) : 0.f;
            dscore[r][c] = valid ? pr * (dscore[r][c] - delta_s[col]) : 0.f;
            prob[r][c] = pr;
          }
        }
        store_scores(buffer, prob);
        __syncthreads();
        tile_product<D>(buffer, dos, acc_v);
        __syncthreads();
        store_scores(buffer, dscore);
        __syncthreads();
        tile_product<D>(buffer, qs, acc_k);
      }
    }
  }
  store_result<D>(d_k, k0, key_rows, p.hkv, kv_head, acc_k, p.scale);
  store_result<D>(d_v, k0, key_rows, p.hkv, kv_head, acc_v, 1.f);
}

// ---- host side -------------------------------------------------------------------------------------------

// A device copy of a host table, freed at scope end (callers synchronise the stream first).
template <class T>
class DeviceTable {
 public:
  DeviceTable() = default;
  DeviceTable(const DeviceTable&) = delete;
  DeviceTable& operator=(const DeviceTable&) = delete;
  ~DeviceTable() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  cudaError_t upload(const std::vector<T>& host, cudaStream_t stream) {
    if (host.empty()) return cudaSuccess;
    REF_TRY(cudaMalloc(&ptr_, host.size() * sizeof(T)));
    return cudaMemcpyAsync(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream);
  }
  const T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

constexpr int64_t kMaxLength = int64_t{1} << 30;  // work tables hold segment-relative positions as int32

bool batch_is_valid(const ReferenceBatch& b) {
  if (b.head_dim != 64 && b.head_dim != 128) return false;
  if (b.hq <= 0 || b.hkv <= 0 || b.hq % b.hkv != 0 || b.hq > 65535) return false;
  if (b.tq < 0 || b.tk < 0 || b.tk > kMaxLength * kTile || b.num_segments < 0 || b.num_segments > kMaxLength) return false;
  if (b.num_segments > 0 && b.segments == nullptr) return false;
  for (int64_t i = 0; i < b.num_segments; ++i) {
    const cad_segment_v1_t& s = b.segments[i];
    if (s.q_offset < 0 || s.q_len < 0 || s.kv_offset < 0 || s.kv_len < 0) return false;
    if (s.q_len > kMaxLength || s.kv_len > kMaxLength) return false;
    if (s.q_offset > b.tq - s.q_len || s.kv_offset > b.tk - s.kv_len) return false;
    if (b.causal && s.q_len > s.kv_len) return false;
  }
  return true;
}

Params make_params(const ReferenceBatch& b, const cad_segment_v1_t* device_segments) {
  return Params{device_segments, b.tq, b.tk, b.hq, b.hkv, b.hq / b.hkv, b.softmax_scale, b.causal};
}

// Query tiles of every segment, the most keys first (the heaviest blocks start first).
std::vector<QueryTile> make_query_tiles(const ReferenceBatch& b) {
  std::vector<QueryTile> tiles;
  for (int64_t s = 0; s < b.num_segments; ++s) {
    const cad_segment_v1_t& seg = b.segments[s];
    for (int64_t begin = 0; begin < seg.q_len; begin += kTile) {
      const int64_t rows = std::min<int64_t>(kTile, seg.q_len - begin);
      const int64_t kv_end = b.causal ? std::min(seg.kv_len, begin + rows + seg.kv_len - seg.q_len) : seg.kv_len;
      tiles.push_back({static_cast<int32_t>(s), static_cast<int32_t>(begin), static_cast<int32_t>(rows),
                       static_cast<int32_t>(std::max<int64_t>(0, kv_end))});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const QueryTile& a, const QueryTile& c) { return a.kv_end > c.kv_end; });
  return tiles;
}

// Every key tile of K/V (including those no segment reads: their dK/dV rows become 0) with the list of
// segments reading it; the most query rows to visit first. False if the lists outgrow int32 offsets.
bool make_key_tiles(const ReferenceBatch& b, std::vector<KeyTile>* tiles, std::vector<int32_t>* segment_index) {
  const int64_t num_tiles = (b.tk + kTile - 1) / kTile;
  std::vector<std::vector<int32_t>> readers(static_cast<size_t>(num_tiles));
  std::vector<int64_t> cost(static_cast<size_t>(num_tiles), 0);
  for (int64_t s = 0; s < b.num_segments; ++s) {
    const cad_segment_v1_t& seg = b.segments[s];
    if (seg.q_len == 0 || seg.kv_len == 0) continue;
    for (int64_t t = seg.kv_offset / kTile; t <= (seg.kv_offset + seg.kv_len - 1) / kTile; ++t) {
      readers[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
      const int64_t lo = std::max(t * kTile, seg.kv_offset) - seg.kv_offset;
      cost[static_cast<size_t>(t)] += seg.q_len - (b.causal ? std::max<int64_t>(0, lo - (seg.kv_len - seg.q_len)) : 0);
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(num_tiles));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t c) { return cost[static_cast<size_t>(a)] > cost[static_cast<size_t>(c)]; });
  tiles->clear();
  segment_index->clear();
  for (int64_t t : order) {
    const auto& list = readers[static_cast<size_t>(t)];
    tiles->push_back({static_cast<int32_t>(t), static_cast<int32_t>(segment_index->size()),
                      static_cast<int32_t>(list.size()), 0});
    segment_index->insert(segment_index->end(), list.begin(), list.end());
    if (segment_index->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) return false;
  }
  return true;
}

template <int D>
constexpr size_t forward_shared_bytes() {
  return (3 * tile_floats<D>() + kScoreFloats) * sizeof(float);
}
template <int D>
constexpr size_t backward_shared_bytes() {
  return (4 * tile_floats<D>() + kScoreFloats + 2 * kTile) * sizeof(float);
}

template <int D>
cudaError_t enqueue_forward(const ReferenceBatch& b, const Params& p, const QueryTile* tiles, int64_t num_tiles,
                            const float* q, const float* k, const float* v, float* o, float* lse, cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
  constexpr size_t bytes = forward_shared_bytes<D>();
  REF_TRY(cudaFuncSetAttribute(forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  forward_kernel<D><<<dim3(static_cast<unsigned>(num_tiles), static_cast<unsigned>(b.hq)), kThreads, bytes, stream>>>(
      p, tiles, q, k, v, o, lse);
  return cudaGetLastError();
}

template <int D>
cudaError_t enqueue_backward(const ReferenceBatch& b, const Params& p, const QueryTile* query_tiles, int64_t num_query_tiles,
                             const KeyTile* key_tiles, int64_t num_key_tiles, const int32_t* segment_index,
                             const float* q, const float* k, const float* v, const float* lse, const float* delta,
                             const float* d_o, float* d_q, float* d_k, float* d_v, cudaStream_t stream) {
  constexpr size_t bytes = backward_shared_bytes<D>();
  if (num_query_tiles > 0) {
    REF_TRY(cudaFuncSetAttribute(grad_q_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    grad_q_kernel<D><<<dim3(static_cast<unsigned>(num_query_tiles), static_cast<unsigned>(b.hq)), kThreads, bytes,
                       stream>>>(p, query_tiles, q, k, v, lse, delta, d_o, d_q);
    REF_TRY(cudaGetLastError());
  }
  if (num_key_tiles > 0) {
    REF_TRY(cudaFuncSetAttribute(grad_kv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    grad_kv_kernel<D><<<dim3(static_cast<unsigned>(num_key_tiles), static_cast<unsigned>(b.hkv)), kThreads, bytes,
                        stream>>>(p, key_tiles, segment_index, q, k, v, lse, delta, d_o, d_k, d_v);
    REF_TRY(cudaGetLastError());
  }
  return cudaSuccess;
}

unsigned fill_blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

cudaError_t forward_enqueue_all(const ReferenceBatch& b, DeviceTable<cad_segment_v1_t>& segments,
                                DeviceTable<QueryTile>& tiles_table, const float* q, const float* k, const float* v,
                                float* o, float* lse, cudaStream_t stream) {
  const std::vector<cad_segment_v1_t> host_segments(b.segments, b.segments + b.num_segments);
  const std::vector<QueryTile> tiles = make_query_tiles(b);
  REF_TRY(segments.upload(host_segments, stream));
  REF_TRY(tiles_table.upload(tiles, stream));
  // Rows no segment covers keep these; covered rows are overwritten.
  const int64_t n_o = b.tq * b.hq * b.head_dim, n_lse = b.tq * b.hq;
  if (n_o > 0) REF_TRY(cudaMemsetAsync(o, 0, static_cast<size_t>(n_o) * sizeof(float), stream));
  if (n_lse > 0) {
    fill_kernel<<<fill_blocks(n_lse), 256, 0, stream>>>(lse, n_lse, -INFINITY);
    REF_TRY(cudaGetLastError());
  }
  const Params p = make_params(b, segments.get());
  const int64_t n = static_cast<int64_t>(tiles.size());
  return b.head_dim == 64 ? enqueue_forward<64>(b, p, tiles_table.get(), n, q, k, v, o, lse, stream)
                          : enqueue_forward<128>(b, p, tiles_table.get(), n, q, k, v, o, lse, stream);
}

}  // namespace

cudaError_t reference_forward(const ReferenceBatch& b, const float* q, const float* k, const float* v, float* o,
                              float* lse, cudaStream_t stream) {
  if (!batch_is_valid(b)) return cudaErrorInvalidValue;
  DeviceTable<cad_segment_v1_t> segments;
  DeviceTable<QueryTile> tiles;
  const cudaError_t enqueued = forward_enqueue_all(b, segments, tiles, q, k, v, o, lse, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);  // before the tables are freed
  return enqueued != cudaSuccess ? enqueued : synced;
}

cudaError_t reference_backward(const ReferenceBatch& b, const float* q, const float* k, const float* v, const float* o,
                               const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v,
                               cudaStream_t stream) {
  if (!batch_is_valid(b)) return cudaErrorInvalidValue;
  DeviceTable<cad_segment_v1_t> segments;
  DeviceTable<QueryTile> query_table;
  DeviceTable<KeyTile> key_table;
  DeviceTable<int32_t> index_table;
  float* delta = nullptr;
  const auto enqueue = [&]() -> cudaError_t {
    const std::vector<cad_segment_v1_t> host_segments(b.segments, b.segments + b.num_segments);
    const std::vector<QueryTile> query_tiles = make_query_tiles(b);
    std::vector<KeyTile> key_tiles;
    std::vector<int32_t> segment_index;
    if (!make_key_tiles(b, &key_tiles, &segment_index)) return cudaErrorInvalidValue;
    REF_TRY(segments.upload(host_segments, stream));
    REF_TRY(query_table.upload(query_tiles, stream));
    REF_TRY(key_table.upload(key_tiles, stream));
    REF_TRY(index_table.upload(segment_index, stream));
    const int64_t n_q = b.tq * b.hq * b.head_dim, n_lse = b.tq * b.hq;
    if (n_lse > 0) {
      REF_TRY(cudaMalloc(&delta, static_cast<size_t>(n_lse) * sizeof(float)));
      const int64_t threads = n_lse * 32;
      delta_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(o, d_o, delta, b.tq, b.hq,
                                                                                       b.head_dim);
      REF_TRY(cudaGetLastError());
    }
    if (n_q > 0) REF_TRY(cudaMemsetAsync(d_q, 0, static_cast<size_t>(n_q) * sizeof(float), stream));  // uncovered rows
    const Params p = make_params(b, segments.get());
    const int64_t nq = static_cast<int64_t>(query_tiles.size()), nk = static_cast<int64_t>(key_tiles.size());
    return b.head_dim == 64
               ? enqueue_backward<64>(b, p, query_table.get(), nq, key_table.get(), nk, index_table.get(), q, k, v, lse,
                                      delta, d_o, d_q, d_k, d_v, stream)
               : enqueue_backward<128>(b, p, query_table.get(), nq, key_table.get(), nk, index_table.get(), q, k, v,
                                       lse, delta, d_o, d_q, d_k, d_v, stream);
  };
  const cudaError_t enqueued = enqueue();
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (delta != nullptr) cudaFree(delta);
  return enqueued != cudaSuccess ? enqueued : synced;
}

}  // namespace cad::gpu_test

// reference_math.cpp -- see reference_math.h.
//
// Work is cut into items that each own a disjoint part of the outputs, so threads never share an
// accumulator and the result does not depend on the schedule:
//  - forward, and backward's dQ: one item per (segment, query head, block of query rows);
//  - backward's dK/dV: one item per (KV head, block of key rows); it walks every segment that reads
//    those keys, in segment order, and every query head of the GQA group, in head order, so shared-KV
//    and GQA contributions are summed in one fixed order. The probabilities are recomputed there
//    rather than shared with the dQ items; that costs compute but needs no reduction step.
// Blocks of rows exist for cache reuse: one key/value row is loaded once per block of query rows.
#include "reference_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "parallel_for.h"

namespace cad::reference {
namespace {

constexpr int64_t kQueryBlock = 32;  // query rows per forward/dQ item
constexpr int64_t kKeyBlock = 64;    // key rows per dK/dV item
constexpr int64_t kRowChunk = 256;   // rows per item of the rowsum(dO * O) pass

// Dot products keep eight fixed partial sums (lanes), held as two 4-float vectors (GCC/Clang vector
// extensions: SSE/NEON registers without intrinsics), combined in one fixed order. Every score is
// computed with this same order, whichever function computes it, so identical inputs give bitwise
// identical scores in every pass.
typedef float Float4 __attribute__((vector_size(16)));

inline Float4 load4(const float* p) {
  Float4 v;
  std::memcpy(&v, p, sizeof(v));  // unaligned load
  return v;
}

inline float combine(Float4 lo, Float4 hi, float tail) {
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3])) + tail;
}

float dot(const float* a, const float* b, int64_t n) {
  Float4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo += load4(a + i) * load4(b + i);
    hi += load4(a + i + 4) * load4(b + i + 4);
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return combine(lo, hi, tail);
}

// Four dot products against one shared vector b, bitwise equal to four dot() calls, loading b once
// and keeping eight independent accumulator chains in flight.
void dot4(const float* const a[4], const float* b, int64_t n, float out[4]) {
  Float4 lo0 = {0, 0, 0, 0}, hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0, lo3 = lo0, hi3 = lo0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Float4 b_lo = load4(b + i), b_hi = load4(b + i + 4);
    lo0 += load4(a[0] + i) * b_lo;
    hi0 += load4(a[0] + i + 4) * b_hi;
    lo1 += load4(a[1] + i) * b_lo;
    hi1 += load4(a[1] + i + 4) * b_hi;
    lo2 += load4(a[2] + i) * b_lo;
    hi2 += load4(a[2] + i + 4) * b_hi;
    lo3 += load4(a[3] + i) * b_lo;
    hi3 += load4(a[3] + i + 4) * b_hi;
  }
  float tails[4] = {0, 0, 0, 0};
  for (int r = 0; r < 4; ++r) {
    for (int64_t t = i; t < n; ++t) tails[r] += a[r][t] * b[t];
  }
  out[0] = combine(lo0, hi0, tails[0]);
  out[1] = combine(lo1, hi1, tails[1]);
  out[2] = combine(lo2, hi2, tails[2]);
  out[3] = combine(lo3, hi3, tails[3]);
}

// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Element offsets into the compact layouts of reference_math.h.
struct Layout {
  explicit Layout(const AttentionBatch& b) : tq(b.tq), hq(b.hq), hkv(b.hkv), d(b.d), group(b.hq / b.hkv) {}
  int64_t q(int64_t row, int64_t head) const { return (row * hq + head) * d; }
  int64_t kv(int64_t row, int64_t head) const { return (row * hkv + head) * d; }
  int64_t lse(int64_t row, int64_t head) const { return head * tq + row; }
  int64_t tq, hq, hkv, d, group;
};

struct QueryBlock {
  int64_t segment;
  int64_t head;   // query head
  int64_t begin;  // query rows [begin, end), relative to the segment
  int64_t end;
};

std::vector<QueryBlock> make_query_blocks(const AttentionBatch& b) {
  std::vector<QueryBlock> blocks;
  for (int64_t s = 0; s < b.num_segments; ++s) {
    for (int64_t h = 0; h < b.hq; ++h) {
      for (int64_t begin = 0; begin < b.segments[s].q_len; begin += kQueryBlock) {
        blocks.push_back({s, h, begin, std::min(begin + kQueryBlock, b.segments[s].q_len)});
      }
    }
  }
  return blocks;
}

// Per-thread buffers, reused across the items a thread runs.
struct Scratch {
  std::vector<float> matrix;     // [rows, end - base]: scores, probabilities or dS of a query block
  std::vector<float> row_sums;   // per row of a block
  std::vector<int64_t> begins;   // visible_range of each row of a block
  std::vector<int64_t> ends;
  std::vector<float> grad_k;     // dK/dV accumulators of a key block
  std::vector<float> grad_v;
};

// The keys a block of query rows reads, [base, end): both ends of a row's range never decrease going
// down a segment, so the first row has the lowest begin and the last the highest end.
struct BlockKeys {
  int64_t base;
  int64_t end;
  int64_t width() const { return end - base; }
};

// Fills scratch.begins/ends for the block's rows.
BlockKeys block_visibility(const AttentionBatch& b, const QueryBlock& block, Scratch& scratch) {
  const cad_segment_v1_t& seg = b.segments[block.segment];
  const size_t rows = static_cast<size_t>(block.end - block.begin);
  scratch.begins.resize(rows);
  scratch.ends.resize(rows);
  for (int64_t i = block.begin; i < block.end; ++i) {
    const KeyRange range = visible_range(seg, i, b);
    scratch.begins[static_cast<size_t>(i - block.begin)] = range.begin;
    scratch.ends[static_cast<size_t>(i - block.begin)] = range.end;
  }
  return {scratch.begins.front(), std::max(scratch.begins.front(), scratch.ends.back())};
}

// The rows of the block that see key j, [first, last): rows gain keys at the end and lose them at the
// start going down, so they are contiguous.
struct RowSpan {
  int64_t first;
  int64_t last;
};
RowSpan rows_seeing(const Scratch& scratch, int64_t j) {
  const auto first = std::upper_bound(scratch.ends.begin(), scratch.ends.end(), j) - scratch.ends.begin();
  const auto last = std::upper_bound(scratch.begins.begin(), scratch.begins.end(), j) - scratch.begins.begin();
  return {first, std::max<int64_t>(first, last)};
}

void forward_block(const AttentionBatch& b, const QueryBlock& block, const float* q, const float* k,
                   const float* v, float* o, float* lse, Scratch& scratch) {
  const Layout at(b);
  const cad_segment_v1_t& seg = b.segments[block.segment];
  const int64_t kv_head = block.head / at.group;
  const int64_t rows = block.end - block.begin;
  const BlockKeys keys = block_visibility(b, block, scratch);
  const int64_t width = keys.width();
  const auto row_of = [&](int64_t r) { return seg.q_offset + block.begin + r; };
  const auto begin_of = [&](int64_t r) { return scratch.begins[static_cast<size_t>(r)]; };
  const auto end_of = [&](int64_t r) { return scratch.ends[static_cast<size_t>(r)]; };
  scratch.matrix.resize(static_cast<size_t>(rows * width));
  scratch.row_sums.resize(static_cast<size_t>(rows));
  float* scores = scratch.matrix.data();  // column c holds key base + c

  for (int64_t j = keys.base; j < keys.end; ++j) {
    const float* key = k + at.kv(seg.kv_offset + j, kv_head);
    const int64_t c = j - keys.base;
    // Rows that see key j are contiguous; take them four at a time.
    const RowSpan span = rows_seeing(scratch, j);
    int64_t r = span.first;
    for (; r + 4 <= span.last; r += 4) {
      const float* queries[4];
      float dots[4];
      for (int x = 0; x < 4; ++x) queries[x] = q + at.q(row_of(r + x), block.head);
      dot4(queries, key, at.d, dots);
      for (int x = 0; x < 4; ++x) scores[(r + x) * width + c] = b.softmax_scale * dots[x];
    }
    for (; r < span.last; ++r) scores[r * width + c] = b.softmax_scale * dot(q + at.q(row_of(r), block.head), key, at.d);
  }
  // Stable softmax: subtract the row maximum before exponentiating; keep exp(s - max) unnormalised.
  for (int64_t r = 0; r < rows; ++r) {
    float* lse_out = lse + at.lse(row_of(r), block.head);
    if (end_of(r) <= begin_of(r)) {  // no keys (non-causal with kv_len 0, or a window past the KV range)
      *lse_out = -std::numeric_limits<float>::infinity();
      scratch.row_sums[static_cast<size_t>(r)] = 0;
      continue;
    }
    float* row = scores + r * width - keys.base;  // row[j] for key j
    float max_score = row[begin_of(r)];
    for (int64_t j = begin_of(r) + 1; j < end_of(r); ++j) max_score = std::max(max_score, row[j]);
    float sum = 0;
    for (int64_t j = begin_of(r); j < end_of(r); ++j) {
      row[j] = std::exp(row[j] - max_score);
      sum += row[j];
    }
    *lse_out = max_score + std::log(sum);
    scratch.row_sums[static_cast<size_t>(r)] = sum;
  }
  for (int64_t r = 0; r < rows; ++r) std::fill_n(o + at.q(row_of(r), block.head), at.d, 0.0f);
  for (int64_t j = keys.base; j < keys.end; ++j) {
    const float* value = v + at.kv(seg.kv_offset + j, kv_head);
    const RowSpan span = rows_seeing(scratch, j);
    for (int64_t r = span.first; r < span.last; ++r) {
      axpy(o + at.q(row_of(r), block.head), scores[r * width + (j - keys.base)], value, at.d);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float sum = scratch.row_sums[static_cast<size_t>(r)];
    if (sum <= 0) continue;
    float* out = o + at.q(row_of(r), block.head);
    for (int64_t e = 0; e < at.d; ++e) out[e] /= sum;
  }
}

// dQ_i = scale * sum_j dS_ij K_j with dS_ij = P_ij (dO_i . V_j - D_i), P_ij = exp(S_ij - LSE_i).
void grad_q_block(const AttentionBatch& b, const QueryBlock& block, const float* q, const float* k, const float* v,
                  const float* lse, const float* d_o, const float* delta, float* d_q, Scratch& scratch) {
  const Layout at(b);
  const cad_segment_v1_t& seg = b.segments[block.segment];
  const int64_t kv_head = block.head / at.group;
  const int64_t rows = block.end - block.begin;
  const BlockKeys keys = block_visibility(b, block, scratch);
  const int64_t width = keys.width();
  const auto row_of = [&](int64_t r) { return seg.q_offset + block.begin + r; };
  scratch.matrix.resize(static_cast<size_t>(rows * width));
  float* d_scores = scratch.matrix.data();  // column c holds key base + c

  for (int64_t j = keys.base; j < keys.end; ++j) {
    const float* key = k + at.kv(seg.kv_offset + j, kv_head);
    const float* value = v + at.kv(seg.kv_offset + j, kv_head);
    const int64_t c = j - keys.base;
    const auto d_score = [&](int64_t r, float score_dot, float dp) {
      const int64_t row = row_of(r);
      const float p = std::exp(b.softmax_scale * score_dot - lse[at.lse(row, block.head)]);
      d_scores[r * width + c] = p * (dp - delta[at.lse(row, block.head)]);
    };
    const RowSpan span = rows_seeing(scratch, j);
    int64_t r = span.first;
    for (; r + 4 <= span.last; r += 4) {
      const float* queries[4];
      const float* grads[4];
      float score_dots[4], dps[4];
      for (int x = 0; x < 4; ++x) {
        queries[x] = q + at.q(row_of(r + x), block.head);
        grads[x] = d_o + at.q(row_of(r + x), block.head);
      }
      dot4(queries, key, at.d, score_dots);
      dot4(grads, value, at.d, dps);
      for (int x = 0; x < 4; ++x) d_score(r + x, score_dots[x], dps[x]);
    }
    for (; r < span.last; ++r) {
      d_score(r, dot(q + at.q(row_of(r), block.head), key, at.d), dot(d_o + at.q(row_of(r), block.head), value, at.d));
    }
  }
  for (int64_t r = 0; r < rows; ++r) std::fill_n(d_q + at.q(row_of(r), block.head), at.d, 0.0f);
  for (int64_t j = keys.base; j < keys.end; ++j) {
    const float* key = k + at.kv(seg.kv_offset + j, kv_head);
    const RowSpan span = rows_seeing(scratch, j);
    for (int64_t r = span.first; r < span.last; ++r) {
      axpy(d_q + at.q(row_of(r), block.head), d_scores[r * width + (j - keys.base)], key, at.d);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* out = d_q + at.q(row_of(r), block.head);
    for (int64_t e = 0; e < at.d; ++e) out[e] *= b.softmax_scale;
  }
}

// dK_j = scale * sum_i dS_ij Q_i and dV_j = sum_i P_ij dO_i over key rows [first, last) of one KV head,
// summing over segments in index order, then query heads, then queries.
void grad_kv_block(const AttentionBatch& b, int64_t kv_head, int64_t first, int64_t last, const float* q,
                   const float* k, const float* v, const float* lse, const float* d_o, const float* delta,
                   float* d_k, float* d_v, Scratch& scratch) {
  const Layout at(b);
  const int64_t rows = last - first;
  scratch.grad_k.assign(static_cast<size_t>(rows * at.d), 0.0f);
  scratch.grad_v.assign(static_cast<size_t>(rows * at.d), 0.0f);
  for (int64_t s = 0; s < b.num_segments; ++s) {
    const cad_segment_v1_t& seg = b.segments[s];
    const int64_t lo = std::max(first, seg.kv_offset) - seg.kv_offset;  // overlap, relative to the segment
    const int64_t hi = std::min(last, seg.kv_offset + seg.kv_len) - seg.kv_offset;
    if (lo >= hi || seg.q_len == 0) continue;
    // Causal: query i sees no key past p = i + (kv_len - q_len); the first query that may see key `lo`:
    const int64_t first_query = b.causal ? std::max<int64_t>(0, lo - (seg.kv_len - seg.q_len)) : 0;
    for (int64_t head = kv_head * at.group; head < (kv_head + 1) * at.group; ++head) {
      for (int64_t i = first_query; i < seg.q_len; ++i) {
        const KeyRange range = visible_range(seg, i, b);
        if (range.begin >= hi) break;  // begins never decrease: no later query sees these keys either
        const int64_t row = seg.q_offset + i;
        const float* query = q + at.q(row, head);
        const float* grad_out = d_o + at.q(row, head);
        const float row_lse = lse[at.lse(row, head)];
        const float row_delta = delta[at.lse(row, head)];
        const int64_t end = std::min(hi, range.end);
        const auto accumulate = [&](int64_t key_row, float score_dot, float dp) {
          const float p = std::exp(b.softmax_scale * score_dot - row_lse);
          const size_t acc = static_cast<size_t>((key_row - first) * at.d);
          axpy(scratch.grad_v.data() + acc, p, grad_out, at.d);
          axpy(scratch.grad_k.data() + acc, p * (dp - row_delta), query, at.d);
        };
        int64_t j = std::max(lo, range.begin);
        for (; j + 4 <= end; j += 4) {  // four keys at a time share the loads of query and dO
          const float* keys[4];
          const float* values[4];
          float score_dots[4], dps[4];
          for (int x = 0; x < 4; ++x) {
            keys[x] = k + at.kv(seg.kv_offset + j + x, kv_head);
            values[x] = v + at.kv(seg.kv_offset + j + x, kv_head);
          }
          dot4(keys, query, at.d, score_dots);
          dot4(values, grad_out, at.d, dps);
          for (int x = 0; x < 4; ++x) accumulate(seg.kv_offset + j + x, score_dots[x], dps[x]);
        }
        for (; j < end; ++j) {
          const int64_t key_row = seg.kv_offset + j;
          accumulate(key_row, dot(k + at.kv(key_row, kv_head), query, at.d), dot(v + at.kv(key_row, kv_head), grad_out, at.d));
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* out_k = d_k + at.kv(first + r, kv_head);
    float* out_v = d_v + at.kv(first + r, kv_head);
    const float* acc_k = scratch.grad_k.data() + r * at.d;
    const float* acc_v = scratch.grad_v.data() + r * at.d;
    for (int64_t e = 0; e < at.d; ++e) {
      out_k[e] = b.softmax_scale * acc_k[e];
      out_v[e] = acc_v[e];
    }
  }
}

}  // namespace

void attention_forward(const AttentionBatch& b, const float* q, const float* k, const float* v, float* o,
                       float* lse, int num_threads) {
  const int threads = resolve_num_threads(num_threads);
  // Rows no segment covers keep these values; covered rows are overwritten by their block.
  std::fill_n(o, b.tq * b.hq * b.d, 0.0f);
  std::fill_n(lse, b.hq * b.tq, -std::numeric_limits<float>::infinity());
  const std::vector<QueryBlock> blocks = make_query_blocks(b);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  parallel_for(static_cast<int64_t>(blocks.size()), threads, [&](int64_t item, int worker) {
    forward_block(b, blocks[static_cast<size_t>(item)], q, k, v, o, lse, scratch[static_cast<size_t>(worker)]);
  });
}

void attention_backward(const AttentionBatch& b, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v, int num_threads) {
  const int threads = resolve_num_threads(num_threads);
  const Layout at(b);

  // D_i = rowsum(dO_i * O_i), laid out like LSE. Rows no segment covers are never read.
  std::vector<float> delta(static_cast<size_t>(b.hq * b.tq), 0.0f);
  const int64_t chunks = (b.tq + kRowChunk - 1) / kRowChunk;
  parallel_for(b.hq * chunks, threads, [&](int64_t item, int) {
    const int64_t head = item / chunks;
    const int64_t begin = (item % chunks) * kRowChunk;
    for (int64_t row = begin; row < std::min(b.tq, begin + kRowChunk); ++row) {
      delta[static_cast<size_t>(at.lse(row, head))] = dot(d_o + at.q(row, head), o + at.q(row, head), b.d);
    }
  });

  // dQ items and dK/dV items write disjoint tensors, so they share one pool of work.
  std::fill_n(d_q, b.tq * b.hq * b.d, 0.0f);
  const std::vector<QueryBlock> blocks = make_query_blocks(b);
  const int64_t num_query_items = static_cast<int64_t>(blocks.size());
  const int64_t key_blocks = (b.tk + kKeyBlock - 1) / kKeyBlock;
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  parallel_for(num_query_items + b.hkv * key_blocks, threads, [&](int64_t item, int worker) {
    Scratch& mine = scratch[static_cast<size_t>(worker)];
    if (item < num_query_items) {
      grad_q_block(b, blocks[static_cast<size_t>(item)], q, k, v, lse, d_o, delta.data(), d_q, mine);
      return;
    }
    const int64_t kv_item = item - num_query_items;
    const int64_t kv_head = kv_item / key_blocks;
    const int64_t first = (kv_item % key_blocks) * kKeyBlock;
    grad_kv_block(b, kv_head, first, std::min(b.tk, first + kKeyBlock), q, k, v, lse, d_o, delta.data(), d_k, d_v,
                  mine);
  });
}

}  // namespace cad::reference

// fuzz_segments.cpp -- the segment-table and tensor-descriptor validators of the attention backends
// (plugins/common/plugin_support.cpp). Whatever they accept is re-checked here in 128-bit arithmetic:
// every range inside [0, Tq) / [0, Tk), q_len <= kv_len when causal, query ranges disjoint; every
// accepted tensor's byte size fits in int64. A refusal must be INVALID_ARGUMENT.
// Windows (ABI v1.2, fields at the int64 limits): the window read from an args struct of any size
// (window.h: a struct too short for the fields CAD_WINDOW_GIVEN promises is refused with ABI_MISMATCH),
// each accepted segment's visible key range (key_range.h) against the mask evaluated in 128 bits, and the
// reference forward and backward over the batch, whose every access ASan checks.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "fuzz_input.h"
#include "key_range.h"
#include "plugin_support.h"
#include "reference_math.h"
#include "window.h"

namespace {

using cad::fuzz::broken;
using Wide = __int128;

void fuzz_segments(cad::fuzz::Input& in) {
  const int64_t tq = in.number(), tk = in.number();
  const bool causal = in.take<uint8_t>() & 1;
  std::vector<cad_segment_v1_t> segments;
  while (!in.empty() && segments.size() < 64) {
    segments.push_back({in.number(), in.number(), in.number(), in.number()});
  }
  try {
    cad::plugin::check_segments(segments.data(), static_cast<int64_t>(segments.size()), tq, tk, causal);
  } catch (const cad::plugin::Failure& f) {
    if (f.status() != CAD_STATUS_INVALID_ARGUMENT) broken("segments refused with a status other than INVALID_ARGUMENT");
    return;
  }
  std::vector<std::pair<Wide, Wide>> q;
  for (const auto& s : segments) {
    if (s.q_offset < 0 || s.q_len < 0 || s.kv_offset < 0 || s.kv_len < 0) broken("a negative segment field accepted");
    if (Wide{s.q_offset} + s.q_len > tq || Wide{s.kv_offset} + s.kv_len > tk) broken("an out-of-range segment accepted");
    if (causal && s.q_len > s.kv_len) broken("a causal segment with q_len > kv_len accepted");
    if (s.q_len > 0) q.emplace_back(s.q_offset, Wide{s.q_offset} + s.q_len);
  }
  std::sort(q.begin(), q.end());
  for (size_t i = 1; i < q.size(); ++i) {
    if (q[i].first < q[i - 1].second) broken("segments overlapping in Q accepted");
  }
}

void fuzz_tensor(cad::fuzz::Input& in) {
  int64_t shape[3] = {in.number(), in.number(), in.number()};
  int64_t strides[3] = {in.number(), in.number(), in.number()};
  alignas(64) static float storage[16];
  cad_tensor_v1_t t{};
  t.data = (in.take<uint8_t>() & 1) ? storage : reinterpret_cast<void*>(in.take<uint64_t>());
  t.device = {CAD_DEVICE_CPU, 0};
  t.ndim = 3;
  t.dtype = (in.take<uint8_t>() & 1) ? cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1} : cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1};
  t.shape = shape;
  t.strides = (in.take<uint8_t>() & 1) ? strides : nullptr;
  t.byte_offset = in.take<uint64_t>();
  try {
    cad::plugin::check_tensor(&t, {"x", CAD_DEVICE_CPU, {-1, -1, -1}, {"A", "B", "C"},
                                   {cad::plugin::DType::F32, cad::plugin::DType::BF16}});
  } catch (const cad::plugin::Failure& f) {
    if (f.status() != CAD_STATUS_INVALID_ARGUMENT) broken("a tensor refused with a status other than INVALID_ARGUMENT");
    return;
  }
  Wide bytes = t.dtype.bits / 8;
  for (int64_t e : shape) {
    if (e < 0) broken("a negative extent accepted");
    bytes *= e;
    if (bytes > INT64_MAX) bytes = Wide{INT64_MAX} + 1;  // saturate: only "fits or not" matters
  }
  if (bytes > INT64_MAX) broken("a tensor of more than INT64_MAX bytes accepted");
  const Wide end = static_cast<Wide>(reinterpret_cast<uintptr_t>(t.data)) + t.byte_offset + bytes;
  if (end > static_cast<Wide>(UINT64_MAX)) broken("a tensor running past the address space accepted");
  if (cad::plugin::tensor_numel(&t) < 0) broken("tensor_numel of an accepted tensor overflowed");
}

// The keys query i of `s` sees, from the definition evaluated in 128 bits (no overflow possible).
cad::mask::KeyRange wide_visible(const cad_segment_v1_t& s, int64_t i, bool causal, int64_t left, int64_t right) {
  const Wide p = Wide{i} + s.kv_len - s.q_len;
  Wide begin = 0, end = s.kv_len;
  if (causal) end = std::min(end, p + 1);
  if (left >= 0) begin = std::max(begin, p - left);
  if (right >= 0) end = std::min(end, p + right + 1);
  begin = std::min<Wide>(begin, s.kv_len);
  end = std::max(begin, end);
  return {static_cast<int64_t>(begin), static_cast<int64_t>(end)};
}

void fuzz_window(cad::fuzz::Input& in) {
  const int64_t tq = in.take<uint8_t>() % 48, tk = in.take<uint8_t>() % 48;
  const bool causal = in.take<uint8_t>() & 1;
  cad_attention_forward_args_v1_t args{};
  args.causal = causal ? 1 : 0;
  args.window_flags = in.take<uint8_t>() % 3 == 0 ? 0u : static_cast<uint32_t>(CAD_WINDOW_GIVEN);
  args.window_left = in.window_limit();
  args.window_right = in.window_limit();
  // The caller's struct: v1.1, cut inside the v1.2 fields, or whole.
  const size_t sizes[] = {CAD_ATTENTION_FORWARD_ARGS_V1_1_SIZE,
                          offsetof(cad_attention_forward_args_v1_t, window_flags) + 4,
                          offsetof(cad_attention_forward_args_v1_t, window_left),
                          offsetof(cad_attention_forward_args_v1_t, window_right),
                          sizeof(cad_attention_forward_args_v1_t), sizeof(cad_attention_forward_args_v1_t)};
  args.struct_size = sizes[in.take<uint8_t>() % 6];
  std::vector<cad_segment_v1_t> segments;
  while (!in.empty() && segments.size() < 8) {
    const int64_t q_len = in.take<uint8_t>() % 24, kv_len = in.take<uint8_t>() % 24;
    segments.push_back({in.take<uint8_t>() % 48, q_len, in.take<uint8_t>() % 48, kv_len});
  }
  cad::plugin::Window window;
  try {
    cad::plugin::check_segments(segments.data(), static_cast<int64_t>(segments.size()), tq, tk, causal);
    window = cad::plugin::read_window(&args, causal, "fuzz");
  } catch (const cad::plugin::Failure& f) {
    if (f.status() == CAD_STATUS_ABI_MISMATCH) {
      if (CAD_HAS_FIELD(cad_attention_forward_args_v1_t, &args, window_right) || args.window_flags == 0) {
        broken("a struct holding the window it flags refused as ABI_MISMATCH");
      }
      return;
    }
    if (f.status() != CAD_STATUS_INVALID_ARGUMENT) broken("a window refused with a status other than INVALID_ARGUMENT");
    return;
  }
  const bool promised = args.window_flags != 0 && args.struct_size > offsetof(cad_attention_forward_args_v1_t, window_flags);
  if (promised && !CAD_HAS_FIELD(cad_attention_forward_args_v1_t, &args, window_right)) {
    broken("CAD_WINDOW_GIVEN accepted in a struct too short for window_left/window_right");
  }
  if (window.left < -1 || window.right < -1 || (causal && window.right != -1)) broken("a malformed window accepted");
  for (const auto& s : segments) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      const cad::mask::KeyRange got =
          cad::mask::segment_visible_keys(i, s.q_len, s.kv_len, causal, window.left, window.right);
      const cad::mask::KeyRange want = wide_visible(s, i, causal, window.left, window.right);
      if (got.begin != want.begin || got.end != want.end) broken("visible_keys differs from the 128-bit mask");
      if (got.begin < 0 || got.end > s.kv_len || got.begin > got.end) broken("visible_keys outside [0, kv_len)");
    }
  }
  // The reference backend over the batch (1 head, D 4): every read and write inside its buffers (ASan), no
  // NaN, and LSE -inf exactly on rows that see no key.
  cad::reference::AttentionBatch b;
  b.tq = tq;
  b.tk = tk;
  b.hq = b.hkv = 1;
  b.d = 4;
  b.segments = segments.data();
  b.num_segments = static_cast<int64_t>(segments.size());
  b.softmax_scale = 0.5f;
  b.causal = causal;
  b.window_left = window.left;
  b.window_right = window.right;
  std::vector<float> q(static_cast<size_t>(tq * 4)), k(static_cast<size_t>(tk * 4)), v(k.size());
  for (size_t x = 0; x < q.size(); ++x) q[x] = static_cast<float>(x % 7) * 0.25f - 0.5f;
  for (size_t x = 0; x < k.size(); ++x) k[x] = static_cast<float>(x % 5) * 0.25f - 0.5f, v[x] = static_cast<float>(x % 3);
  std::vector<float> o(q.size()), lse(static_cast<size_t>(tq)), d_o(q.size(), 1.0f), d_q(q.size()), d_k(k.size()), d_v(k.size());
  cad::reference::attention_forward(b, q.data(), k.data(), v.data(), o.data(), lse.data(), 1);
  for (const auto& s : segments) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      const bool sees = wide_visible(s, i, causal, window.left, window.right).size() > 0;
      const float l = lse[static_cast<size_t>(s.q_offset + i)];
      if (std::isnan(l) || (sees != (l != -std::numeric_limits<float>::infinity()))) {
        broken("LSE is not finite exactly on the rows that see a key");
      }
    }
  }
  cad::reference::attention_backward(b, q.data(), k.data(), v.data(), o.data(), lse.data(), d_o.data(), d_q.data(),
                                     d_k.data(), d_v.data(), 1);
  for (float x : d_q) if (std::isnan(x)) broken("a NaN in dQ");
  for (float x : d_k) if (std::isnan(x)) broken("a NaN in dK");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cad::fuzz::Input in(data, size);
  const uint8_t mode = in.take<uint8_t>() % 3;
  if (mode == 1) {
    fuzz_tensor(in);
  } else if (mode == 2) {
    fuzz_window(in);
  } else {
    fuzz_segments(in);
  }
  return 0;
}

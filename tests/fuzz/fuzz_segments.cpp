// fuzz_segments.cpp -- the segment-table and tensor-descriptor validators of the attention backends
// (plugins/common/plugin_support.cpp). Whatever they accept is re-checked here in 128-bit arithmetic:
// every range inside [0, Tq) / [0, Tk), q_len <= kv_len when causal, query ranges disjoint; every
// accepted tensor's byte size fits in int64. A refusal must be INVALID_ARGUMENT.
#include <algorithm>
#include <vector>

#include "fuzz_input.h"
#include "plugin_support.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cad::fuzz::Input in(data, size);
  if (in.take<uint8_t>() & 1) {
    fuzz_tensor(in);
  } else {
    fuzz_segments(in);
  }
  return 0;
}

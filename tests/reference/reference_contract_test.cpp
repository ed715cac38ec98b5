// reference_contract_test.cpp -- everything the reference plugin must refuse, with the right status
// and a message naming the tensor/argument, leaving outputs untouched; plus its entry table,
// capabilities, config handling and statistics.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "plugin_under_test.h"
#include "reference_oracle.h"

namespace cad::testing {
namespace {

Problem small_problem(int64_t hq = 4, int64_t hkv = 2, int64_t d = 16) {
  Problem p;
  p.tq = p.tk = 8;
  p.hq = hq;
  p.hkv = hkv;
  p.d = d;
  p.scale = 0.25f;
  p.causal = true;
  p.segments = {{0, 8, 0, 8}};
  return p;
}

class ReferenceRefusal : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(instance.ok()) << instance.create_error(); }

  // The call must fail with `status`, name `needle` in last_error, and leave every output as it was.
  void expect_forward_refused(cad_status_t status, const std::string& needle) {
    const auto o_before = t.o.bytes(), lse_before = t.lse.bytes();
    EXPECT_EQ(api->forward(instance.ctx(), &fwd), status);
    EXPECT_NE(std::string(instance.last_error()).find(needle), std::string::npos)
        << "last_error '" << instance.last_error() << "' does not mention " << needle;
    EXPECT_TRUE(t.o.bytes() == o_before && t.lse.bytes() == lse_before) << "outputs were touched";
  }
  void expect_backward_refused(cad_status_t status, const std::string& needle) {
    const auto dq = t.d_q.bytes(), dk = t.d_k.bytes(), dv = t.d_v.bytes();
    EXPECT_EQ(api->backward(instance.ctx(), &bwd), status);
    EXPECT_NE(std::string(instance.last_error()).find(needle), std::string::npos)
        << "last_error '" << instance.last_error() << "' does not mention " << needle;
    EXPECT_TRUE(t.d_q.bytes() == dq && t.d_k.bytes() == dk && t.d_v.bytes() == dv) << "outputs were touched";
  }

  Problem p = small_problem();
  PluginUnderTest& plugin = reference_plugin();
  const cad_attention_v1_t* api = plugin.api();
  Instance instance{plugin, "{}"};
  AttentionTensors t{p, Dtype::F32, 1};
  // Both argument structs point at the same tensor views; a test edits a view through t.x.view()'s
  // pointer (already taken here) or points an argument at another tensor.
  cad_attention_forward_args_v1_t fwd = forward_args(p, t);
  cad_attention_backward_args_v1_t bwd = backward_args(p, t);
};

TEST_F(ReferenceRefusal, ValidArgumentsAreAccepted) {
  EXPECT_EQ(api->forward(instance.ctx(), &fwd), CAD_STATUS_OK) << instance.last_error();
  EXPECT_EQ(api->backward(instance.ctx(), &bwd), CAD_STATUS_OK) << instance.last_error();
  EXPECT_STREQ(instance.last_error(), "");
}

TEST_F(ReferenceRefusal, WrongDtype) {
  const_cast<cad_tensor_v1_t*>(fwd.k)->dtype = {CAD_DTYPE_CODE_FLOAT, 16, 1};  // fp16
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'k'");
}

TEST_F(ReferenceRefusal, Fp64Query) {
  const_cast<cad_tensor_v1_t*>(fwd.q)->dtype = {CAD_DTYPE_CODE_FLOAT, 64, 1};
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'q'");
}

TEST_F(ReferenceRefusal, MixedDtypes) {
  HostTensor v_bf16({p.tk, p.hkv, p.d}, Dtype::BF16);
  fwd.v = v_bf16.view();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'v'");
}

TEST_F(ReferenceRefusal, LseMustBeFp32) {
  HostTensor lse_bf16({p.hq, p.tq}, Dtype::BF16);
  fwd.lse = lse_bf16.view();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'lse'");
}

TEST_F(ReferenceRefusal, ValueRowsDifferFromKey) {
  HostTensor v9({9, p.hkv, p.d}, Dtype::F32);
  fwd.v = v9.view();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'v'");
}

TEST_F(ReferenceRefusal, KeyHeadDimDiffersFromQuery) {
  HostTensor k32({p.tk, p.hkv, 32}, Dtype::F32);
  fwd.k = k32.view();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'k'");
}

TEST_F(ReferenceRefusal, OutputShapeMismatch) {
  HostTensor o_wide({p.tq, p.hq, 32}, Dtype::F32);
  fwd.o = o_wide.view();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'o'");
}

TEST_F(ReferenceRefusal, LseShapeMismatch) {
  HostTensor lse_t({p.tq, p.hq}, Dtype::F32);  // transposed: [Tq, Hq] instead of [Hq, Tq]
  fwd.lse = lse_t.view();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'lse'");
}

TEST_F(ReferenceRefusal, GradientShapeMismatch) {
  HostTensor dk_one_head({p.tk, 1, p.d}, Dtype::F32);
  bwd.d_k = dk_one_head.view();
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "'d_k'");
}

TEST_F(ReferenceRefusal, GradientOfOutputShapeMismatch) {
  HostTensor d_o({p.tq + 1, p.hq, p.d}, Dtype::F32);
  bwd.d_o = d_o.view();
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "'d_o'");
}

TEST_F(ReferenceRefusal, GradientDtypeMismatch) {
  HostTensor d_q({p.tq, p.hq, p.d}, Dtype::BF16);
  bwd.d_q = d_q.view();
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "'d_q'");
}

TEST_F(ReferenceRefusal, GqaHeadsNotDivisible) {
  const Problem bad = small_problem(6, 4);
  AttentionTensors bt(bad, Dtype::F32, 2);
  fwd = forward_args(bad, bt);
  const auto o_before = bt.o.bytes();
  EXPECT_EQ(api->forward(instance.ctx(), &fwd), CAD_STATUS_INVALID_ARGUMENT);
  const std::string message = instance.last_error();
  EXPECT_NE(message.find("Hq=6"), std::string::npos) << message;
  EXPECT_NE(message.find("Hkv=4"), std::string::npos) << message;
  EXPECT_TRUE(bt.o.bytes() == o_before);
}

TEST_F(ReferenceRefusal, HeadDimAbove256IsUnsupported) {
  const Problem big = small_problem(2, 1, 320);
  AttentionTensors bt(big, Dtype::F32, 2);
  fwd = forward_args(big, bt);
  EXPECT_EQ(api->forward(instance.ctx(), &fwd), CAD_STATUS_UNSUPPORTED);
  const std::string message = instance.last_error();
  EXPECT_NE(message.find("'q'"), std::string::npos) << message;
  EXPECT_NE(message.find("320"), std::string::npos) << message;
  bwd = backward_args(big, bt);
  EXPECT_EQ(api->backward(instance.ctx(), &bwd), CAD_STATUS_UNSUPPORTED);
}

TEST_F(ReferenceRefusal, CudaTensor) {
  const_cast<cad_tensor_v1_t*>(fwd.q)->device = {CAD_DEVICE_CUDA, 0};
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'q'");
}

TEST_F(ReferenceRefusal, CudaGradientTensor) {
  bwd.d_v->device = {CAD_DEVICE_CUDA, 0};
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "'d_v'");
}

TEST_F(ReferenceRefusal, NullTensor) {
  fwd.v = nullptr;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'v'");
}

TEST_F(ReferenceRefusal, NullGradientOfOutput) {
  bwd.d_o = nullptr;
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "'d_o'");
}

TEST_F(ReferenceRefusal, NullData) {
  const_cast<cad_tensor_v1_t*>(fwd.k)->data = nullptr;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'k'");
}

TEST_F(ReferenceRefusal, NonCompactStrides) {
  int64_t strides[3] = {p.hq * p.d * 2, p.d, 1};  // rows padded: not the compact layout
  const_cast<cad_tensor_v1_t*>(fwd.q)->strides = strides;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'q'");
}

TEST_F(ReferenceRefusal, SegmentOutOfBounds) {
  const cad_segment_v1_t segments[] = {{0, 4, 0, 4}, {4, 4, 6, 4}};  // KV rows 6..9 of Tk=8
  fwd.segments = segments;
  fwd.num_segments = 2;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "segment 1");
}

// Range checks must not overflow: offset + len computed in int64 wraps for these, and the unchecked
// sum passed the bound check (issue 10: OK after writing before O, a hang, INTERNAL after writing).
TEST_F(ReferenceRefusal, SegmentOffsetPlusLengthOverflowsInQ) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const cad_segment_v1_t segments[] = {{kMax - 1, 2, 0, 8}};
  fwd.segments = segments;
  fwd.causal = 0;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "segment 0");
  bwd.segments = segments;
  bwd.causal = 0;
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "segment 0");
}

TEST_F(ReferenceRefusal, SegmentLengthsNearInt64Max) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const cad_segment_v1_t huge_q[] = {{4, kMax, 0, 8}};
  fwd.segments = huge_q;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "segment 0");
  const cad_segment_v1_t huge_kv[] = {{0, 4, 4, kMax}};
  fwd.segments = huge_kv;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "segment 0");
  const cad_segment_v1_t negative_offset[] = {{-kMax, kMax, 0, 8}};
  fwd.segments = negative_offset;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "segment 0");
}

// A shape whose byte count does not fit in 64 bits describes no real buffer, even if the segments
// only touch its first rows: refused before anything is read or written.
TEST_F(ReferenceRefusal, ShapeTimesElementSizeOverflows) {
  constexpr int64_t kRows = int64_t{1} << 60;  // x 4 heads x 16 x 4 bytes = 2^68 bytes
  for (const cad_tensor_v1_t* x : std::vector<const cad_tensor_v1_t*>{fwd.q, fwd.k, fwd.v, fwd.o}) {
    const_cast<cad_tensor_v1_t*>(x)->shape[0] = kRows;
  }
  const_cast<cad_tensor_v1_t*>(fwd.lse)->shape[1] = kRows;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "64-bit");
}

TEST_F(ReferenceRefusal, ByteOffsetWrapsTheAddressSpace) {
  const_cast<cad_tensor_v1_t*>(fwd.o)->byte_offset = std::numeric_limits<uint64_t>::max() - 8;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "'o'");
}

TEST_F(ReferenceRefusal, CausalSegmentWithMoreQueriesThanKeys) {
  const cad_segment_v1_t segments[] = {{0, 8, 0, 4}};
  bwd.segments = segments;
  expect_backward_refused(CAD_STATUS_INVALID_ARGUMENT, "q_len");
}

TEST_F(ReferenceRefusal, SegmentsOverlapInQ) {
  const cad_segment_v1_t segments[] = {{0, 5, 0, 5}, {4, 4, 0, 8}};
  fwd.segments = segments;
  fwd.num_segments = 2;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "overlap");
}

TEST_F(ReferenceRefusal, NullSegmentTable) {
  fwd.segments = nullptr;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "segments");
}

TEST_F(ReferenceRefusal, StreamMustBeNull) {
  int not_a_stream = 0;
  fwd.stream = &not_a_stream;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "stream");
}

TEST_F(ReferenceRefusal, CausalFlagOutOfRange) {
  fwd.causal = 2;
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "causal");
}

TEST_F(ReferenceRefusal, NonFiniteScale) {
  fwd.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_forward_refused(CAD_STATUS_INVALID_ARGUMENT, "softmax_scale");
}

TEST_F(ReferenceRefusal, PiecesAreUnsupported) {
  const cad_piece_v1_t pieces[] = {{0, 8, 0, 8}};
  fwd.pieces = pieces;
  fwd.num_pieces = 1;
  expect_forward_refused(CAD_STATUS_UNSUPPORTED, "pieces");
}

TEST_F(ReferenceRefusal, ArgsTooSmallOrNull) {
  fwd.struct_size = CAD_ATTENTION_FORWARD_ARGS_V1_0_SIZE - 8;  // smaller than even ABI v1.0 allows
  expect_forward_refused(CAD_STATUS_ABI_MISMATCH, "struct_size");
  EXPECT_EQ(api->forward(instance.ctx(), nullptr), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(api->backward(instance.ctx(), nullptr), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(api->forward(nullptr, &fwd), CAD_STATUS_INVALID_ARGUMENT);
}

TEST_F(ReferenceRefusal, LastErrorClearsOnSuccess) {
  fwd.causal = 2;
  EXPECT_NE(api->forward(instance.ctx(), &fwd), CAD_STATUS_OK);
  EXPECT_STRNE(instance.last_error(), "");
  fwd.causal = 1;
  EXPECT_EQ(api->forward(instance.ctx(), &fwd), CAD_STATUS_OK);
  EXPECT_STREQ(instance.last_error(), "");
}

// ---- entry table, capabilities, config, statistics ----------------------------------------------

TEST(ReferencePlugin, EntryTable) {
  const cad_plugin_v1_t* entry = reference_plugin().plugin();
  EXPECT_EQ(entry->struct_size, sizeof(cad_plugin_v1_t));
  EXPECT_EQ(entry->kind, CAD_PLUGIN_KIND_ATTENTION);
  EXPECT_STREQ(entry->name, "reference");
  EXPECT_EQ(entry->attention->struct_size, sizeof(cad_attention_v1_t));
  EXPECT_EQ(entry->communicator, nullptr);
  EXPECT_EQ(entry->balancer, nullptr);
  EXPECT_NE(entry->attention->get_stats_json, nullptr);
}

TEST(ReferencePlugin, Capabilities) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, nullptr);
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(plugin.api()->get_capabilities(instance.ctx(), &caps), CAD_STATUS_OK);
  EXPECT_EQ(caps.device_type, CAD_DEVICE_CPU);
  EXPECT_EQ(caps.dtype_mask, static_cast<uint32_t>(CAD_ATTENTION_DTYPE_FP32 | CAD_ATTENTION_DTYPE_BF16));
  EXPECT_EQ(caps.flags, static_cast<uint32_t>(CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL |
                                              CAD_ATTENTION_CAP_GQA | CAD_ATTENTION_CAP_SHARED_KV |
                                              CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_WINDOW));
  EXPECT_EQ(caps.head_dim_mask, 0xffffu);
  EXPECT_EQ(caps.max_head_dim, 256);
  EXPECT_EQ(caps.min_compute_capability, 0);
  caps.struct_size = 8;
  EXPECT_EQ(plugin.api()->get_capabilities(instance.ctx(), &caps), CAD_STATUS_ABI_MISMATCH);
}

TEST(ReferencePlugin, ConfigErrorsNameTheKey) {
  PluginUnderTest& plugin = reference_plugin();
  for (const char* config : {"{\"num_threads\": -1}", "{\"num_threads\": \"four\"}", "{\"num_threads\": 1.5}"}) {
    Instance instance(plugin, config);
    EXPECT_FALSE(instance.ok()) << config;
    EXPECT_EQ(instance.create_status(), CAD_STATUS_INVALID_CONFIG) << config;
    EXPECT_NE(instance.create_error().find("num_threads"), std::string::npos) << instance.create_error();
  }
  for (const char* config : {"{not json", "[1, 2]"}) {
    Instance instance(plugin, config);
    EXPECT_EQ(instance.create_status(), CAD_STATUS_INVALID_CONFIG) << config;
    EXPECT_FALSE(instance.create_error().empty());
  }
}

TEST(ReferencePlugin, UnknownConfigKeyWarns) {
  PluginUnderTest plugin(CAD_REFERENCE_PLUGIN_PATH);  // its own log
  Instance instance(plugin, "{\"num_threads\": 2, \"bogus_key\": true}");
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  bool warned = false;
  for (const LogLine& line : plugin.log()) {
    warned = warned || (line.level == CAD_LOG_WARN && line.message.find("bogus_key") != std::string::npos);
  }
  EXPECT_TRUE(warned);
}

TEST(ReferencePlugin, StatsReportLastCallTimings) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  Problem p = small_problem();
  AttentionTensors t(p, Dtype::F32, 3);
  ASSERT_EQ(run_forward_backward(instance, plugin.api(), p, t).backward, CAD_STATUS_OK) << instance.last_error();

  size_t needed = 0;
  char tiny[4];
  EXPECT_EQ(plugin.api()->get_stats_json(instance.ctx(), tiny, sizeof(tiny), &needed), CAD_STATUS_INVALID_ARGUMENT);
  ASSERT_GT(needed, sizeof(tiny));
  std::string buffer(needed, '\0');
  ASSERT_EQ(plugin.api()->get_stats_json(instance.ctx(), buffer.data(), buffer.size(), &needed), CAD_STATUS_OK);
  const nlohmann::json stats = nlohmann::json::parse(buffer.c_str());
  ASSERT_TRUE(stats.contains("forward_ms") && stats.contains("backward_ms")) << buffer;
  EXPECT_GE(stats["forward_ms"].get<double>(), 0.0);
  EXPECT_GE(stats["backward_ms"].get<double>(), 0.0);
}

}  // namespace
}  // namespace cad::testing

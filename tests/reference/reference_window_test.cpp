// reference_window_test.cpp -- sliding windows (ABI v1.2) in the reference backend: O, LSE, dQ, dK, dV
// against the tests' fp64 attention with a dense per-key mask (naive_attention.cpp), for windows from 0
// to longer than the document, causal and not, with GQA; CAD-style tasks with trimmed KV ranges equal the
// whole document; the refusals, which name the argument; and a zero-initialised struct, which has no window.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>

#include "naive_attention.h"
#include "plugin_under_test.h"
#include "reference_oracle.h"

namespace cad::testing {
namespace {

// Three documents (lengths 37, 1, 70) packed back to back, one segment each, GQA 4:2, D=16.
Problem documents(bool causal, int64_t left, int64_t right) {
  Problem p;
  p.tq = p.tk = 108;
  p.hq = 4;
  p.hkv = 2;
  p.d = 16;
  p.scale = 0.25f;
  p.causal = causal;
  p.window_left = left;
  p.window_right = right;
  p.segments = {{0, 37, 0, 37}, {37, 1, 37, 1}, {38, 70, 38, 70}};
  return p;
}

void expect_matches_oracle(const Problem& p, double tolerance = 1e-5) {
  cad::testing::expect_matches_oracle(p, Dtype::F32, tolerance, 17);
}

// 0 (each query sees itself only), 1, block-sized and odd windows, and windows as long as or longer
// than the longest document (70).
constexpr int64_t kLefts[] = {0, 1, 2, 5, 31, 32, 33, 69, 70, 500};

TEST(ReferenceWindow, CausalLeftWindowsMatchDenseMask) {
  for (int64_t left : kLefts) {
    SCOPED_TRACE("window_left=" + std::to_string(left));
    expect_matches_oracle(documents(true, left, -1));
    expect_matches_oracle(documents(true, left, 0));  // (left, 0): the same window, PyTorch's spelling
  }
}

TEST(ReferenceWindow, NonCausalWindowsMatchDenseMask) {
  for (int64_t left : {-1, 0, 3, 40, 500}) {
    for (int64_t right : {-1, 0, 1, 7, 69, 500}) {
      SCOPED_TRACE("window=(" + std::to_string(left) + ", " + std::to_string(right) + ")");
      expect_matches_oracle(documents(false, left, right));
    }
  }
}

// Segments whose KV range is longer or shorter than their queries: the bottom-right alignment decides
// where the window sits, as it does for the causal mask; rows whose window lies outside the KV range see
// no key (LSE -inf, O 0).
TEST(ReferenceWindow, UnequalSegmentsMatchDenseMask) {
  Problem p = documents(false, 2, 1);
  p.tq = 40;
  p.tk = 40;
  p.segments = {{0, 5, 0, 40}, {5, 30, 30, 6}, {35, 5, 36, 4}};
  expect_matches_oracle(p);
  p.causal = true;
  p.window_right = -1;
  p.segments = {{0, 5, 0, 40}, {5, 3, 30, 6}, {8, 4, 36, 4}};
  expect_matches_oracle(p);
}

// A document cut into CAD tasks, each with the KV range a windowed task needs, [max(0, q_begin - left),
// q_end), all reading one shared copy of the document's K/V: the same O, LSE, dQ, dK, dV as the whole
// document in one segment. This is the alignment CAD relies on.
TEST(ReferenceWindow, TrimmedTaskRangesEqualTheWholeDocument) {
  const int64_t left = 9;
  Problem whole = documents(true, left, -1);
  whole.tq = whole.tk = 70;
  whole.segments = {{0, 70, 0, 70}};
  Problem tasks = whole;
  tasks.segments.clear();
  const int64_t cuts[] = {0, 4, 30, 31, 58, 70};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const int64_t kv_begin = std::max<int64_t>(0, cuts[i] - left);
    tasks.segments.push_back({cuts[i], cuts[i + 1] - cuts[i], kv_begin, cuts[i + 1] - kv_begin});
  }
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  AttentionTensors a(whole, Dtype::F32, 5), b(tasks, Dtype::F32, 5);
  ASSERT_EQ(run_forward_backward(instance, plugin.api(), whole, a).backward, CAD_STATUS_OK) << instance.last_error();
  ASSERT_EQ(run_forward_backward(instance, plugin.api(), tasks, b).backward, CAD_STATUS_OK) << instance.last_error();
  EXPECT_LE(relative_error(b.o.to_double(), a.o.to_double()), 1e-6) << "O";
  EXPECT_LE(relative_error(b.lse.to_double(), a.lse.to_double()), 1e-6) << "LSE";
  EXPECT_LE(relative_error(b.d_q.to_double(), a.d_q.to_double()), 1e-6) << "dQ";
  EXPECT_LE(relative_error(b.d_k.to_double(), a.d_k.to_double()), 1e-5) << "dK";
  EXPECT_LE(relative_error(b.d_v.to_double(), a.d_v.to_double()), 1e-5) << "dV";
  expect_matches_oracle(tasks);
}

// A window at least as long as every document computes exactly what no window computes.
TEST(ReferenceWindow, WindowLongerThanEveryDocumentIsNoWindow) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  for (bool causal : {true, false}) {
    const Problem none = documents(causal, -1, -1);
    const Problem wide = documents(causal, 70, causal ? -1 : 70);
    AttentionTensors a(none, Dtype::F32, 9), b(wide, Dtype::F32, 9);
    ASSERT_EQ(run_forward_backward(instance, plugin.api(), none, a).backward, CAD_STATUS_OK);
    ASSERT_EQ(run_forward_backward(instance, plugin.api(), wide, b).backward, CAD_STATUS_OK);
    EXPECT_TRUE(a.o.bytes() == b.o.bytes() && a.lse.bytes() == b.lse.bytes()) << "causal=" << causal;
    EXPECT_TRUE(a.d_q.bytes() == b.d_q.bytes() && a.d_k.bytes() == b.d_k.bytes() && a.d_v.bytes() == b.d_v.bytes());
  }
}

TEST(ReferenceWindow, CapabilityIsReported) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(plugin.api()->get_capabilities(instance.ctx(), &caps), CAD_STATUS_OK);
  EXPECT_TRUE(caps.flags & CAD_ATTENTION_CAP_WINDOW);
}

// Bad windows are refused before any work, naming the field; a caller built before ABI v1.2 (a 112-byte
// struct) gets no window whatever lies past its struct.
TEST(ReferenceWindow, RefusalsNameTheArgument) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  struct Bad {
    bool causal;
    int64_t left, right;
    const char* names;
  };
  for (const Bad& bad : {Bad{true, -2, -1, "window_left"}, Bad{false, 3, -7, "window_right"},
                         Bad{true, 3, 1, "window_right"}}) {
    const Problem p = documents(bad.causal, bad.left, bad.right);
    AttentionTensors t(p, Dtype::F32, 1);
    const cad_attention_forward_args_v1_t fwd = forward_args(p, t);
    EXPECT_EQ(plugin.api()->forward(instance.ctx(), &fwd), CAD_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(instance.last_error()).find(bad.names), std::string::npos) << instance.last_error();
    const cad_attention_backward_args_v1_t bwd = backward_args(p, t);
    EXPECT_EQ(plugin.api()->backward(instance.ctx(), &bwd), CAD_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(instance.last_error()).find(bad.names), std::string::npos) << instance.last_error();
  }

  const Problem p = documents(true, -1, -1);
  AttentionTensors old(p, Dtype::F32, 2), now(p, Dtype::F32, 2);
  cad_attention_forward_args_v1_t fwd = forward_args(p, old);
  fwd.struct_size = CAD_ATTENTION_FORWARD_ARGS_V1_1_SIZE;
  fwd.window_left = -5;  // beyond the caller's struct: never read
  fwd.window_right = 3;
  ASSERT_EQ(plugin.api()->forward(instance.ctx(), &fwd), CAD_STATUS_OK) << instance.last_error();
  const cad_attention_forward_args_v1_t plain = forward_args(p, now);
  ASSERT_EQ(plugin.api()->forward(instance.ctx(), &plain), CAD_STATUS_OK);
  EXPECT_TRUE(old.o.bytes() == now.o.bytes());
}

// A caller that zero-initialises a v1.2 struct and sets struct_size = sizeof gets no window: window_flags
// is 0, so window_left/right are not read though they hold 0. Forward and backward then equal plain
// (causal or full) attention. With CAD_WINDOW_GIVEN the same (0, 0) keeps its meaning: each query sees its
// own key only. Unknown flag bits and a nonzero reserved word are refused.
TEST(ReferenceWindow, ZeroInitialisedStructsHaveNoWindow) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const Problem plain = documents(causal, -1, -1);
    AttentionTensors t(plain, Dtype::F32, 3);
    // The v1.1 fields as the harness fills them; every byte of the v1.2 fields zero.
    const cad_attention_forward_args_v1_t filled_fwd = forward_args(plain, t);
    cad_attention_forward_args_v1_t fwd;
    std::memset(&fwd, 0, sizeof fwd);
    std::memcpy(&fwd, &filled_fwd, CAD_ATTENTION_FORWARD_ARGS_V1_1_SIZE);
    fwd.struct_size = sizeof fwd;
    ASSERT_EQ(fwd.window_flags, 0u);
    ASSERT_EQ(fwd.window_left, 0);
    ASSERT_EQ(fwd.window_right, 0);
    ASSERT_EQ(plugin.api()->forward(instance.ctx(), &fwd), CAD_STATUS_OK) << instance.last_error();
    const cad_attention_backward_args_v1_t filled_bwd = backward_args(plain, t);
    cad_attention_backward_args_v1_t bwd;
    std::memset(&bwd, 0, sizeof bwd);
    std::memcpy(&bwd, &filled_bwd, CAD_ATTENTION_BACKWARD_ARGS_V1_1_SIZE);
    bwd.struct_size = sizeof bwd;
    ASSERT_EQ(plugin.api()->backward(instance.ctx(), &bwd), CAD_STATUS_OK) << instance.last_error();
    const NaiveForward want = naive_forward(plain, t.q.to_double(), t.k.to_double(), t.v.to_double());
    const NaiveGradients grads =
        naive_backward(plain, t.q.to_double(), t.k.to_double(), t.v.to_double(), t.d_o.to_double());
    EXPECT_LE(relative_error(t.o.to_double(), want.o), 1e-5) << "O";
    EXPECT_LE(relative_error(t.lse.to_double(), want.lse), 1e-5) << "LSE";
    EXPECT_LE(relative_error(t.d_q.to_double(), grads.d_q), 1e-5) << "dQ";
    EXPECT_LE(relative_error(t.d_k.to_double(), grads.d_k), 1e-5) << "dK";
    EXPECT_LE(relative_error(t.d_v.to_double(), grads.d_v), 1e-5) << "dV";

    // The flag with (0, 0): a window of the query's own key, not plain attention.
    const Problem own_key = documents(causal, 0, 0);
    expect_matches_oracle(own_key);
    AttentionTensors w(own_key, Dtype::F32, 3);
    cad_attention_forward_args_v1_t given = forward_args(own_key, w);
    ASSERT_EQ(given.window_flags, static_cast<uint32_t>(CAD_WINDOW_GIVEN));
    ASSERT_EQ(plugin.api()->forward(instance.ctx(), &given), CAD_STATUS_OK) << instance.last_error();
    EXPECT_FALSE(w.o.bytes() == t.o.bytes());
    EXPECT_GT(relative_error(w.o.to_double(), want.o), 1e-2);

    given.window_flags = CAD_WINDOW_GIVEN | 4u;
    EXPECT_EQ(plugin.api()->forward(instance.ctx(), &given), CAD_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(instance.last_error()).find("window_flags"), std::string::npos) << instance.last_error();
    given.window_flags = CAD_WINDOW_GIVEN;
    given.reserved_v1_2 = 1;
    EXPECT_EQ(plugin.api()->forward(instance.ctx(), &given), CAD_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(instance.last_error()).find("reserved_v1_2"), std::string::npos) << instance.last_error();
  }
}

// Windows at the int64 limits hide no key: (-1, INT64_MAX) non-causal is full attention, and a left of
// INT64_MAX on a segment with more queries than keys (query positions p < 0) sees every key from 0. A
// window computed as `p + right + 1` / `p - left` wraps there (O zero and LSE -inf with OK, or a key range
// outside the segment); these must equal the unwindowed call bit for bit and the dense mask.
TEST(ReferenceWindow, WindowsAtTheInt64LimitsHideNoKey) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{\"num_threads\": 2}");
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  struct Limit {
    bool causal;
    int64_t left, right;
  };
  for (const Limit& w : {Limit{false, -1, kMax}, Limit{false, kMax, -1}, Limit{false, kMax, kMax},
                         Limit{false, kMax - 1, kMax - 1}, Limit{false, kMax, 0}, Limit{true, kMax, -1},
                         Limit{true, kMax, 0}}) {
    SCOPED_TRACE("causal=" + std::to_string(w.causal) + " window=(" + std::to_string(w.left) + ", " +
                 std::to_string(w.right) + ")");
    // Whole documents, and non-causal segments with q_len > kv_len and q_len < kv_len.
    Problem p = documents(w.causal, w.left, w.right);
    if (!w.causal) {
      p.tq = 40;
      p.tk = 40;
      p.segments = {{0, 5, 0, 40}, {5, 30, 30, 6}, {35, 5, 36, 4}};
    }
    expect_matches_oracle(p);
    if (w.right == 0) continue;  // (kMax, 0) non-causal hides keys after p: no unwindowed twin
    Problem plain = p;
    plain.window_left = plain.window_right = -1;
    AttentionTensors at_limit(p, Dtype::F32, 5), unwindowed(plain, Dtype::F32, 5);
    ASSERT_EQ(run_forward_backward(instance, plugin.api(), p, at_limit).forward, CAD_STATUS_OK) << instance.last_error();
    ASSERT_EQ(run_forward_backward(instance, plugin.api(), plain, unwindowed).backward, CAD_STATUS_OK);
    EXPECT_TRUE(at_limit.o.bytes() == unwindowed.o.bytes()) << "O";
    EXPECT_TRUE(at_limit.lse.bytes() == unwindowed.lse.bytes()) << "LSE";
    EXPECT_TRUE(at_limit.d_q.bytes() == unwindowed.d_q.bytes()) << "dQ";
    EXPECT_TRUE(at_limit.d_k.bytes() == unwindowed.d_k.bytes()) << "dK";
    EXPECT_TRUE(at_limit.d_v.bytes() == unwindowed.d_v.bytes()) << "dV";
  }
}

// A v1.2 struct that holds window_flags but ends before window_right, with CAD_WINDOW_GIVEN set, promises a
// window it does not carry: refused, naming the struct and its size, never run as no window. Without the
// flag the same short struct is plain attention. A size inside the v1.1 fields (plan but not saved) is
// refused too.
TEST(ReferenceWindow, StructTooShortForItsFlagsIsRefused) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  const Problem p = documents(true, 3, -1);
  AttentionTensors t(p, Dtype::F32, 4);
  const size_t fwd_short[] = {offsetof(cad_attention_forward_args_v1_t, window_flags) + 4,
                              offsetof(cad_attention_forward_args_v1_t, window_left),
                              offsetof(cad_attention_forward_args_v1_t, window_right),
                              offsetof(cad_attention_forward_args_v1_t, window_right) + 4};
  for (size_t size : fwd_short) {
    SCOPED_TRACE("struct_size=" + std::to_string(size));
    cad_attention_forward_args_v1_t fwd = forward_args(p, t);
    fwd.struct_size = size;
    ASSERT_EQ(fwd.window_flags, static_cast<uint32_t>(CAD_WINDOW_GIVEN));
    EXPECT_EQ(plugin.api()->forward(instance.ctx(), &fwd), CAD_STATUS_ABI_MISMATCH);
    const std::string error = instance.last_error();
    EXPECT_NE(error.find("cad_attention_forward_args_v1_t"), std::string::npos) << error;
    EXPECT_NE(error.find("struct_size is " + std::to_string(size)), std::string::npos) << error;
    fwd.window_flags = 0;  // no window promised: the short struct is plain causal attention
    EXPECT_EQ(plugin.api()->forward(instance.ctx(), &fwd), CAD_STATUS_OK) << instance.last_error();
  }
  cad_attention_backward_args_v1_t bwd = backward_args(p, t);
  bwd.struct_size = offsetof(cad_attention_backward_args_v1_t, window_right);
  EXPECT_EQ(plugin.api()->backward(instance.ctx(), &bwd), CAD_STATUS_ABI_MISMATCH);
  EXPECT_NE(std::string(instance.last_error()).find("cad_attention_backward_args_v1_t"), std::string::npos)
      << instance.last_error();

  cad_attention_forward_args_v1_t partial = forward_args(p, t);
  partial.struct_size = offsetof(cad_attention_forward_args_v1_t, saved);  // holds plan, not saved
  EXPECT_EQ(plugin.api()->forward(instance.ctx(), &partial), CAD_STATUS_ABI_MISMATCH);
  EXPECT_NE(std::string(instance.last_error()).find("struct_size is " + std::to_string(partial.struct_size)),
            std::string::npos) << instance.last_error();
}

}  // namespace
}  // namespace cad::testing

// call_check_test.cpp -- the one check of a CAD call against its plan (plugins/cad/call_check.h), without ranks:
// every tensor of either direction that differs from the plan's shape or dtype is refused with INVALID_ARGUMENT
// naming that tensor and the plan; the pieces and mask the call still carries are compared with the plan's
// (omitted pieces are the plan's); a call without a plan is checked against its own pieces.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "call_check.h"

namespace cp = cad::cad_plugin;

namespace {

// One rank's call: T=6 tokens in two pieces, Hq=4, Hkv=2, D=8, fp32, on the CPU, compact tensors.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  cad_tensor_v1_t view{};
  explicit Tensor(std::vector<int64_t> dims) : shape(std::move(dims)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(static_cast<size_t>(n), 0.0f);
  }
  cad_tensor_v1_t* desc() {
    view.data = data.data();
    view.device = {CAD_DEVICE_CPU, 0};
    view.ndim = static_cast<int32_t>(shape.size());
    view.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
    view.shape = shape.data();
    view.strides = nullptr;
    return &view;
  }
};

struct Call {
  std::vector<cad_piece_v1_t> pieces = {{1, 4, 0, 4}, {2, 9, 7, 2}};
  Tensor q{{6, 4, 8}}, k{{6, 2, 8}}, v{{6, 2, 8}}, o{{6, 4, 8}}, lse{{4, 6}};
  Tensor d_o{{6, 4, 8}}, d_q{{6, 4, 8}}, d_k{{6, 2, 8}}, d_v{{6, 2, 8}};
  cad_attention_forward_args_v1_t fwd{};
  cad_attention_backward_args_v1_t bwd{};

  template <class Args>
  void fill(Args& a, bool with_pieces) {
    a.struct_size = sizeof(a);
    a.pieces = with_pieces ? pieces.data() : nullptr;
    a.num_pieces = with_pieces ? static_cast<int64_t>(pieces.size()) : 0;
    a.softmax_scale = 0.25f;
    a.causal = 1;
    a.q = q.desc(), a.k = k.desc(), a.v = v.desc(), a.o = o.desc(), a.lse = lse.desc();
  }
  const cad_attention_forward_args_v1_t* forward(bool with_pieces = false) {
    fill(fwd, with_pieces);
    return &fwd;
  }
  const cad_attention_backward_args_v1_t* backward(bool with_pieces = false) {
    fill(bwd, with_pieces);
    bwd.d_o = d_o.desc(), bwd.d_q = d_q.desc(), bwd.d_k = d_k.desc(), bwd.d_v = d_v.desc();
    return &bwd;
  }
};

cp::Accepts cpu_backend() {
  cp::Accepts accepts;
  accepts.device_type = CAD_DEVICE_CPU;
  accepts.dtype_mask = CAD_ATTENTION_DTYPE_FP32 | CAD_ATTENTION_DTYPE_BF16;
  accepts.flags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                  CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_WINDOW;
  accepts.max_head_dim = 256;
  return accepts;
}

// The plan `call` was made for (serial 7).
struct Plan {
  cp::CallShape shape;
  std::vector<cad_piece_v1_t> pieces;
  Plan() {
    shape.tokens = 6, shape.num_q_heads = 4, shape.num_kv_heads = 2, shape.head_dim = 8, shape.causal = true;
    pieces = Call().pieces;
  }
  cp::PlanFixed fixed() const { return {shape, pieces, 7}; }
};

// The check's verdict: OK, or the status and message of its one refusal.
struct Verdict {
  cad_status_t status = CAD_STATUS_OK;
  std::string message;
};
template <class Args>
Verdict check(const Args* args, const cp::PlanFixed* plan) {
  try {
    cp::check_call(cp::CallArgs::of(args), cpu_backend(), plan);
    return {};
  } catch (const cad::plugin::Failure& f) {
    return {f.status(), f.what()};
  }
}

void expect_refused(const Verdict& v, const std::vector<std::string>& needles) {
  EXPECT_EQ(v.status, CAD_STATUS_INVALID_ARGUMENT) << v.message;
  for (const std::string& n : needles) EXPECT_NE(v.message.find(n), std::string::npos) << n << " in: " << v.message;
}

}  // namespace

TEST(CallCheck, ACallThatMatchesItsPlanPassesWithOrWithoutItsPieces) {
  const Plan plan;
  const cp::PlanFixed fixed = plan.fixed();
  Call call;
  for (bool with_pieces : {false, true}) {
    const cp::CallShape f = cp::check_call(cp::CallArgs::of(call.forward(with_pieces)), cpu_backend(), &fixed);
    EXPECT_EQ(f.tokens, 6);
    EXPECT_EQ(f.softmax_scale, 0.25f);  // the call's: a plan fixes no scale
    EXPECT_EQ(check(call.backward(with_pieces), &fixed).status, CAD_STATUS_OK) << check(call.backward(), &fixed).message;
  }
}

TEST(CallCheck, EveryTensorOfEitherDirectionThatDiffersFromThePlanIsRefusedNamingIt) {
  const Plan plan;
  const cp::PlanFixed fixed = plan.fixed();
  struct Case {
    const char* tensor;
    bool backward;
    std::function<void(Call&)> edit;
    const char* what;
  };
  const std::vector<Case> cases = {
      {"q", false, [](Call& c) { c.q.shape[1] = 2; }, "dim 1 (Hq) is 2, expected 4"},
      {"k", false, [](Call& c) { c.k.shape[0] = 5; }, "dim 0 (Tk) is 5, expected 6"},
      {"v", false, [](Call& c) { c.v.shape[2] = 4; }, "dim 2 (D) is 4, expected 8"},
      {"o", false, [](Call& c) { c.o.shape = {6, 32}; }, "expected 3 dims"},
      {"lse", false, [](Call& c) { c.lse.shape = {6, 4}; }, "dim 0 (Hq) is 6, expected 4"},
      {"d_o", true, [](Call& c) { c.d_o.shape[0] = 7; }, "dim 0 (Tq) is 7, expected 6"},
      {"d_q", true, [](Call& c) { c.d_q.shape[1] = 8; }, "dim 1 (Hq) is 8, expected 4"},
      {"d_k", true, [](Call& c) { c.d_k.shape[1] = 4; }, "dim 1 (Hkv) is 4, expected 2"},
      {"d_v", true, [](Call& c) { c.d_v.shape[2] = 16; }, "dim 2 (D) is 16, expected 8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    Call call;
    c.edit(call);
    const Verdict v = c.backward ? check(call.backward(), &fixed) : check(call.forward(), &fixed);
    const std::string named = std::string("tensor '") + c.tensor + "'";
    expect_refused(v, {named + ": " + c.what});
    EXPECT_EQ(v.message.find(named), v.message.rfind(named)) << "the tensor is named once: " << v.message;
    if (std::string(c.what).find("dims") == std::string::npos) {
      EXPECT_NE(v.message.find("as plan #7 fixed"), std::string::npos) << v.message;
    }
  }
}

TEST(CallCheck, ADtypeStridesOrDeviceOtherThanThePlansAreRefusedNamingTheTensor) {
  const Plan plan;
  const cp::PlanFixed fixed = plan.fixed();
  {
    Call call;
    const cad_attention_backward_args_v1_t* args = call.backward();
    call.d_k.view.dtype = {CAD_DTYPE_CODE_BFLOAT, 16, 1};  // (desc() was taken: edit the view itself)
    expect_refused(check(args, &fixed), {"tensor 'd_k': expected dtype fp32 (as plan #7 fixed", "got bf16"});
  }
  {
    Call call;
    const cad_attention_forward_args_v1_t* args = call.forward();
    int64_t padded[] = {4 * 8 * 2, 8, 1};  // every row twice as long as compact
    call.q.view.strides = padded;
    expect_refused(check(args, &fixed), {"tensor 'q': expected compact row-major strides"});
  }
  {
    Call call;
    const cad_attention_forward_args_v1_t* args = call.forward();
    call.v.view.device = {CAD_DEVICE_CUDA, 0};
    expect_refused(check(args, &fixed), {"tensor 'v': expected a CPU tensor"});
  }
}

TEST(CallCheck, PiecesAndMaskTheCallStillCarriesAreComparedWithThePlans) {
  const Plan plan;
  const cp::PlanFixed fixed = plan.fixed();
  {
    Call call;
    call.pieces[1].offset_in_doc = 6;  // another micro-batch's layout, same token count
    expect_refused(check(call.forward(true), &fixed), {"forward: the call's pieces differ from those plan #7",
                                                       "another micro-batch"});
  }
  {
    Call call;
    cad_attention_forward_args_v1_t args = *call.forward();
    args.causal = 0;
    expect_refused(check(&args, &fixed), {"forward: causal is 0 but plan #7 was made with causal = 1"});
  }
  {
    Call call;
    cad_attention_backward_args_v1_t args = *call.backward();
    args.window_flags = CAD_WINDOW_GIVEN;
    args.window_left = 3;
    args.window_right = -1;
    expect_refused(check(&args, &fixed), {"backward: window_left is 3 but plan #7 was made for window_left -1"});
  }
  {
    Call call;
    cad_attention_forward_args_v1_t args = *call.forward();
    args.softmax_scale = 0.0f;  // per call: checked at every call
    expect_refused(check(&args, &fixed), {"softmax_scale is 0"});
  }
}

TEST(CallCheck, ACallWithoutAPlanIsCheckedAgainstItsOwnPieces) {
  Call call;
  EXPECT_EQ(check(call.backward(true), nullptr).status, CAD_STATUS_OK) << check(call.backward(true), nullptr).message;
  call.pieces[0].len = 5;  // 7 tokens in the pieces, 6 rows in the tensors
  expect_refused(check(call.forward(true), nullptr), {"tensor 'q' has 6 rows (Tq) but the local pieces hold 7 tokens"});
  Call other;
  other.d_v.shape[1] = 4;
  expect_refused(check(other.backward(true), nullptr), {"tensor 'd_v': dim 1 (Hkv) is 4, expected 2"});
}

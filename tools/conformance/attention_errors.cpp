// attention_errors.cpp -- malformed calls: each must return the right status with a message (naming
// the tensor at fault where there is one) and leave every output untouched.
#include <functional>
#include <list>

#include "attention_internal.h"

namespace cad::conformance {

namespace {

// Storage for the altered descriptors and tables one error case builds.
struct Scratch {
  struct Desc {
    cad_tensor_v1_t t;
    std::vector<int64_t> shape;
  };
  std::list<Desc> descs;  // list: elements never move, so t.shape stays valid
  std::vector<cad_segment_v1_t> segments;

  cad_tensor_v1_t* copy(const cad_tensor_v1_t* base) {
    descs.push_back(Desc{*base, std::vector<int64_t>(base->shape, base->shape + base->ndim)});
    descs.back().t.shape = descs.back().shape.data();
    return &descs.back().t;
  }
};

struct Expectation {
  std::vector<cad_status_t> statuses;  // any of these
  std::string tensor;                  // must be named quoted in last_error, or "" for none
};

const Expectation kInvalid{{CAD_STATUS_INVALID_ARGUMENT}, ""};

Expectation invalid_naming(const std::string& tensor) { return {{CAD_STATUS_INVALID_ARGUMENT}, tensor}; }
Expectation refused_naming(const std::string& tensor) {
  return {{CAD_STATUS_INVALID_ARGUMENT, CAD_STATUS_UNSUPPORTED}, tensor};
}

class ErrorChecker {
 public:
  ErrorChecker(Backend& b, const AttentionProblem& p, CallTensors& t, Report& report)
      : b_(b), p_(p), t_(t), report_(report) {}

  using ForwardEdit = std::function<void(cad_attention_forward_args_v1_t&, Scratch&)>;
  using BackwardEdit = std::function<void(cad_attention_backward_args_v1_t&, Scratch&)>;

  void forward(const std::string& name, const Expectation& want, const ForwardEdit& edit, bool null_args = false) {
    t_.fill_outputs_with_sentinel();
    Scratch scratch;
    cad_attention_forward_args_v1_t args = t_.forward_args(p_);
    scratch.segments = p_.segments;
    args.segments = scratch.segments.data();
    if (edit) edit(args, scratch);
    const cad_status_t status = b_.table->forward(b_.ctx, null_args ? nullptr : &args);
    b_.memory->synchronize();
    judge("error.forward." + name, want, status, t_.forward_outputs_untouched());
  }

  void backward(const std::string& name, const Expectation& want, const BackwardEdit& edit, bool null_args = false) {
    for (Tensor* g : {&t_.d_q, &t_.d_k, &t_.d_v}) g->fill_sentinel();
    Scratch scratch;
    cad_attention_backward_args_v1_t args = t_.backward_args(p_);
    scratch.segments = p_.segments;
    args.segments = scratch.segments.data();
    if (edit) edit(args, scratch);
    const cad_status_t status = b_.table->backward(b_.ctx, null_args ? nullptr : &args);
    b_.memory->synchronize();
    judge("error.backward." + name, want, status, t_.backward_outputs_untouched());
  }

 private:
  void judge(const std::string& check, const Expectation& want, cad_status_t status, bool untouched) {
    const std::string error = last_error_of(b_.life, b_.ctx);
    std::string problem;
    bool status_ok = false;
    for (cad_status_t s : want.statuses) status_ok = status_ok || s == status;
    if (!status_ok) problem += "returned " + status_name(status) + ", expected " + status_name(want.statuses[0]) + "; ";
    if (status != CAD_STATUS_OK && (error.empty() || error == "<NULL>")) problem += "no last_error message; ";
    if (status != CAD_STATUS_OK && !want.tensor.empty() && !names_quoted(error, want.tensor)) {
      problem += "last_error does not name '" + want.tensor + "': \"" + error + "\"; ";
    }
    if (!untouched) problem += "outputs were written; ";
    report_.expect(problem.empty(), check, problem.substr(0, problem.size() >= 2 ? problem.size() - 2 : 0));
  }

  Backend& b_;
  const AttentionProblem& p_;
  CallTensors& t_;
  Report& report_;
};

void forward_errors(ErrorChecker& c, const AttentionProblem& p, cad_device_type_t device) {
  const cad_device_type_t other_device = device == CAD_DEVICE_CPU ? CAD_DEVICE_CUDA : CAD_DEVICE_CPU;
  c.forward("args_null", kInvalid, nullptr, true);
  c.forward("q_null", invalid_naming("q"), [](auto& a, Scratch&) { a.q = nullptr; });
  c.forward("o_null", invalid_naming("o"), [](auto& a, Scratch&) { a.o = nullptr; });
  c.forward("lse_null", invalid_naming("lse"), [](auto& a, Scratch&) { a.lse = nullptr; });
  c.forward("q_data_null", invalid_naming("q"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* q = s.copy(a.q);
    q->data = nullptr;
    a.q = q;
  });
  c.forward("q_dtype", refused_naming("q"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* q = s.copy(a.q);
    q->dtype = cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 64, 1};
    a.q = q;
  });
  c.forward("lse_dtype", refused_naming("lse"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* lse = s.copy(a.lse);
    lse->dtype = cad_dtype_v1_t{CAD_DTYPE_CODE_INT, 32, 1};
    a.lse = lse;
  });
  c.forward("q_device", refused_naming("q"), [other_device](auto& a, Scratch& s) {
    cad_tensor_v1_t* q = s.copy(a.q);
    q->device.device_type = other_device;
    a.q = q;
  });
  // Shapes only ever shrink, so a backend that reads before it checks stays inside the buffers.
  c.forward("k_shape", invalid_naming("k"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* k = s.copy(a.k);
    k->shape[2] /= 2;
    a.k = k;
  });
  c.forward("v_shape", invalid_naming("v"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* v = s.copy(a.v);
    v->shape[0] -= 1;
    a.v = v;
  });
  c.forward("v_ndim", invalid_naming("v"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* v = s.copy(a.v);
    v->ndim = 2;
    v->shape[1] *= v->shape[2];
    a.v = v;
  });
  c.forward("o_shape", invalid_naming("o"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* o = s.copy(a.o);
    o->shape[0] -= 1;
    a.o = o;
  });
  c.forward("lse_shape", invalid_naming("lse"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* lse = s.copy(a.lse);
    lse->shape[1] -= 1;
    a.lse = lse;
  });
  c.forward("segments_null", kInvalid, [](auto& a, Scratch&) { a.segments = nullptr; });
  c.forward("num_segments_negative", kInvalid, [](auto& a, Scratch&) { a.num_segments = -1; });
  c.forward("segment_q_out_of_range", kInvalid, [&p](auto&, Scratch& s) {
    s.segments[0].q_len = p.tq - s.segments[0].q_offset + 1;
    s.segments[0].kv_len = p.tk - s.segments[0].kv_offset;
  });
  c.forward("segment_kv_out_of_range", kInvalid,
            [&p](auto&, Scratch& s) { s.segments[0].kv_len = p.tk - s.segments[0].kv_offset + 1; });
  c.forward("segment_negative_length", kInvalid, [](auto&, Scratch& s) { s.segments[1].q_len = -1; });
  c.forward("segments_overlap_in_q", kInvalid, [](auto&, Scratch& s) { s.segments[1].q_offset = s.segments[0].q_offset; });
  if (p.causal) {
    c.forward("causal_q_longer_than_kv", kInvalid, [](auto&, Scratch& s) { s.segments[0].kv_len = s.segments[0].q_len - 1; });
  }
}

void backward_errors(ErrorChecker& c, const AttentionProblem& p) {
  c.backward("args_null", kInvalid, nullptr, true);
  c.backward("d_o_null", invalid_naming("d_o"), [](auto& a, Scratch&) { a.d_o = nullptr; });
  c.backward("d_k_null", invalid_naming("d_k"), [](auto& a, Scratch&) { a.d_k = nullptr; });
  c.backward("d_q_shape", invalid_naming("d_q"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* d_q = s.copy(a.d_q);
    d_q->shape[0] -= 1;
    a.d_q = d_q;
  });
  c.backward("d_v_shape", invalid_naming("d_v"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* d_v = s.copy(a.d_v);
    d_v->shape[2] /= 2;
    a.d_v = d_v;
  });
  c.backward("lse_shape", invalid_naming("lse"), [](auto& a, Scratch& s) {
    cad_tensor_v1_t* lse = s.copy(a.lse);
    lse->shape[0] -= 1;
    a.lse = lse;
  });
  c.backward("segment_q_out_of_range", kInvalid, [&p](auto&, Scratch& s) {
    s.segments[0].q_len = p.tq - s.segments[0].q_offset + 1;
    s.segments[0].kv_len = p.tk - s.segments[0].kv_offset;
  });
}

}  // namespace

void check_argument_errors(Backend& b, Report& report) {
  const int64_t d = main_head_dim(b);
  const ElementType type = b.supports(ElementType::F32) ? ElementType::F32 : ElementType::BF16;
  if (d == 0 || !b.supports(type)) return;
  std::seed_seq seed{11u};
  std::mt19937_64 rng(seed);
  const bool causal = b.has(CAD_ATTENTION_CAP_CAUSAL);
  // kv_prefix batches have at least 5 segments, all with 1 <= q_len < kv_len.
  const AttentionProblem p = make_problem(CaseSpec{Layout::kKvPrefix, type, causal, 2, 2, d}, rng);
  const std::vector<double> d_o = random_values(static_cast<size_t>(p.tq * p.hq * p.d), type, rng);
  CallTensors t(*b.memory, p, type, d_o);
  ErrorChecker checker(b, p, t, report);
  forward_errors(checker, p, b.caps.device_type);

  if (!b.has(CAD_ATTENTION_CAP_BACKWARD)) return;
  // Backward's inputs O and LSE from a valid forward.
  t.fill_outputs_with_sentinel();
  cad_attention_forward_args_v1_t fa = t.forward_args(p);
  const cad_status_t status = b.table->forward(b.ctx, &fa);
  b.memory->synchronize();
  if (!report.expect(status == CAD_STATUS_OK, "error.backward.setup",
                     "the valid forward before the backward error checks returned " + status_name(status))) {
    return;
  }
  backward_errors(checker, p);
}

}  // namespace cad::conformance

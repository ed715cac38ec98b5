// handles.cpp -- see handles.h.
#include "handles.h"

#include <atomic>
#include <cstring>

#include "plugin_support.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

unsigned long long ull(uint64_t x) { return static_cast<unsigned long long>(x); }

struct Fnv {
  uint64_t h = 14695981039346656037ull;
  void add(uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  void add_piece(const cad_piece_v1_t& p) {  // field by field: no padding bytes hashed
    add(static_cast<uint64_t>(p.doc_id)), add(static_cast<uint64_t>(p.doc_len));
    add(static_cast<uint64_t>(p.offset_in_doc)), add(static_cast<uint64_t>(p.len));
  }
};

std::string describe(const CallShape& s) {
  // window_left only when there is one: the message travels in a fixed-size rank header (step.cpp).
  const std::string window =
      s.window_left >= 0 ? format(", window_left=%lld", static_cast<long long>(s.window_left)) : std::string();
  return format("T=%lld, Hq=%d, Hkv=%d, D=%d, %s, causal=%d%s, device %d:%d", static_cast<long long>(s.tokens),
                s.num_q_heads, s.num_kv_heads, s.head_dim, s.bf16 ? "bf16" : "fp32", s.causal ? 1 : 0,
                window.c_str(), s.device_type, s.device_id);
}

bool same_shape(const CallShape& a, const CallShape& b) {
  return a.tokens == b.tokens && a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.bf16 == b.bf16 && a.causal == b.causal && a.window_left == b.window_left &&
         a.device_type == b.device_type && a.device_id == b.device_id;
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// "saved handle (forward call 7, plan #3)": how messages name a saved state.
std::string name(const SavedStamp& s) {
  return format("saved handle (forward call %llu, plan #%llu)", ull(s.forward_call), ull(s.plan.serial));
}

const char* kind_name(int32_t kind) {
  switch (kind) {
    case kMakePlan: return "make_plan";
    case kForward: return "forward";
    case kBackward: return "backward";
  }
  return "unknown call";
}

}  // namespace

uint64_t next_handle_serial() {
  static std::atomic<uint64_t> serial{0};  // see handles.h: uniqueness across instances needs one counter
  return ++serial;
}

uint64_t pieces_fingerprint(const cad_piece_v1_t* pieces, int64_t num_pieces) {
  Fnv f;
  f.add(static_cast<uint64_t>(num_pieces));
  for (int64_t i = 0; i < num_pieces; ++i) f.add_piece(pieces[i]);
  return f.h;
}

uint64_t documents_fingerprint(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks,
                               const CallShape& shape) {
  Fnv f;
  f.add(tables.size());
  for (const auto& table : tables) {
    f.add(table.size());
    for (const cad_piece_v1_t& p : table) f.add_piece(p);
  }
  f.add(tasks.size());
  for (const cad_task_v1_t& t : tasks) {
    f.add(static_cast<uint64_t>(t.doc_id)), f.add(static_cast<uint64_t>(t.q_begin));
    f.add(static_cast<uint64_t>(t.q_end)), f.add(static_cast<uint64_t>(t.server));
  }
  f.add(static_cast<uint64_t>(shape.num_q_heads)), f.add(static_cast<uint64_t>(shape.num_kv_heads));
  f.add(static_cast<uint64_t>(shape.head_dim)), f.add(shape.bf16 ? 1 : 0), f.add(shape.causal ? 1 : 0);
  f.add(static_cast<uint64_t>(shape.window_left));
  return f.h;
}

void check_saved_fits(const SavedStamp& saved, const PlanStamp* plan, const CallShape& call, uint64_t call_pieces,
                      const char* what) {
  if (plan != nullptr && saved.plan.serial != plan->serial) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the %s comes from a forward with plan #%llu, this call has plan #%llu: pass the state of this "
                "plan's forward",
                what, name(saved).c_str(), ull(saved.plan.serial), ull(plan->serial)));
  }
  if (plan == nullptr && !same_shape(saved.plan.shape, call)) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the %s was made by a forward of (%s), this call is (%s): tokens and shapes must be the forward's",
                what, name(saved).c_str(), describe(saved.plan.shape).c_str(), describe(call).c_str()));
  }
  if (plan == nullptr && saved.plan.local_pieces != call_pieces) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the %s was made by a forward of other pieces than this call's (another micro-batch?)", what,
                name(saved).c_str()));
  }
  if (!same_float(saved.softmax_scale, call.softmax_scale)) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the %s was made by a forward with softmax_scale %.9g, this call has %.9g: the kept LSE holds the "
                "forward's scale",
                what, name(saved).c_str(), saved.softmax_scale, call.softmax_scale));
  }
}

void check_saved_documents(const SavedStamp& saved, uint64_t plan_documents, const char* what) {
  if (saved.plan.documents != plan_documents) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the %s was made by a forward over other documents (the pieces of every rank) than this call's "
                "(another micro-batch on some rank?)",
                what, name(saved).c_str()));
  }
}

std::string HandleRegistry::not_live(const void* handle, const char* what) const {
  return format("%s: %s handle %p is not live on this instance (released already, never made, or made by another "
                "instance)",
                what, kind_, handle);
}

void HandleRegistry::check_live(const void* handle, const char* what) const {
  if (!live(handle)) fail(CAD_STATUS_INVALID_ARGUMENT, not_live(handle, what));
}

void check_tickets(const std::vector<CallTicket>& tickets, const char* what) {
  if (tickets.empty()) return;
  const CallTicket& t0 = tickets[0];
  for (size_t rank = 1; rank < tickets.size(); ++rank) {
    const CallTicket& t = tickets[rank];
    if (t.call != t0.call || t.kind != t0.kind) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("%s: ranks are not in the same call: rank 0 is in %s (call %llu of its instance), rank %zu in %s "
                  "(call %llu): every rank must make the same calls on the instance in the same order",
                  what, kind_name(t0.kind), ull(t0.call), rank, kind_name(t.kind), ull(t.call)));
    }
    if (t.documents != t0.documents) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("%s: ranks disagree on the documents: rank 0's plan or saved state was made for other documents "
                  "than rank %zu's (a plan or state of another micro-batch on one rank?)",
                  what, rank));
    }
    if (!same_float(t.softmax_scale, t0.softmax_scale)) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("%s: ranks disagree on softmax_scale: rank 0 has %.9g, rank %zu has %.9g", what, t0.softmax_scale,
                  rank, t.softmax_scale));
    }
    if (t.saved_forward != t0.saved_forward) {
      auto of = [](uint64_t call) {
        return call == 0 ? std::string("none") : format("forward call %llu's", ull(call));
      };
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("%s: ranks pass the saved state of different forwards: rank 0 passes %s, rank %zu passes %s "
                  "(backwards called in another order on one rank?)",
                  what, of(t0.saved_forward).c_str(), rank, of(t.saved_forward).c_str()));
    }
  }
}

}  // namespace cad::cad_plugin

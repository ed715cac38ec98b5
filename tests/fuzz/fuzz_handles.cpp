// fuzz_handles.cpp -- CAD's handle checks (plugins/cad/handles.cpp): the registry of an instance's live plan
// and saved handles, a backward's saved state against its call, and the tickets ranks compare. Invariants:
// the registry answers exactly as a model set does and never dereferences what it is asked about (the
// handles here are freed objects, so a read is a heap-use-after-free for ASan); a saved state is accepted
// exactly when every field its check compares is equal; tickets are accepted exactly when every rank's is
// rank 0's; every refusal is INVALID_ARGUMENT with a message naming the handle or the ranks.
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "handles.h"
#include "plugin_support.h"

namespace {

using cad::fuzz::broken;
using namespace cad::cad_plugin;

// Few distinct values per field, so that equal and unequal fields both come up often.
float scale(cad::fuzz::Input& in) {
  static const float values[] = {0.25f, 0.125f, 0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN()};
  return values[in.take<uint8_t>() % 5];
}

CallShape shape(cad::fuzz::Input& in) {
  CallShape s;
  s.tokens = in.take<uint8_t>() % 3;
  s.num_q_heads = in.take<uint8_t>() % 2 + 1;
  s.num_kv_heads = 1;
  s.head_dim = 16 * (in.take<uint8_t>() % 2 + 1);
  s.bf16 = in.take<uint8_t>() % 2;
  s.causal = in.take<uint8_t>() % 2;
  s.device_type = in.take<uint8_t>() % 2 ? CAD_DEVICE_CUDA : CAD_DEVICE_CPU;
  s.device_id = in.take<uint8_t>() % 2;
  return s;
}

PlanStamp plan_stamp(cad::fuzz::Input& in) {
  PlanStamp p;
  p.serial = in.take<uint8_t>() % 3;
  p.documents = in.take<uint8_t>() % 3;
  p.local_pieces = in.take<uint8_t>() % 3;
  p.shape = shape(in);
  return p;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool same_shape(const CallShape& a, const CallShape& b) {
  return a.tokens == b.tokens && a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.bf16 == b.bf16 && a.causal == b.causal && a.device_type == b.device_type &&
         a.device_id == b.device_id;
}

// Runs `check`; returns whether it accepted. A refusal must be INVALID_ARGUMENT naming `needle`.
template <class Check>
bool accepted(Check&& check, const char* needle) {
  try {
    check();
    return true;
  } catch (const cad::plugin::Failure& f) {
    if (f.status() != CAD_STATUS_INVALID_ARGUMENT) broken("a handle check refused with a status not INVALID_ARGUMENT");
    if (std::string(f.what()).find(needle) == std::string::npos) broken(std::string("a refusal without ") + needle);
    return false;
  }
}

void fuzz_registry(cad::fuzz::Input& in) {
  std::vector<const void*> handles;
  for (int i = 0; i < 4; ++i) handles.push_back(new int64_t(i));
  for (const void* h : handles) delete static_cast<const int64_t*>(h);  // dangling from here: never to be read
  HandleRegistry registry("saved");
  std::set<const void*> model;
  const int ops = in.take<uint8_t>() % 32;
  for (int i = 0; i < ops; ++i) {
    const void* h = handles[in.take<uint8_t>() % handles.size()];
    switch (in.take<uint8_t>() % 3) {
      case 0:
        registry.add(h);
        model.insert(h);
        break;
      case 1:
        if (registry.remove(h) != (model.erase(h) == 1)) broken("registry: remove disagrees with the model");
        break;
      default:
        if (accepted([&] { registry.check_live(h, "fuzz"); }, "not live") != (model.count(h) == 1)) {
          broken("registry: check_live disagrees with the model");
        }
    }
    if (registry.size() != model.size() || registry.live(h) != (model.count(h) == 1)) broken("registry: size or live");
  }
}

void fuzz_saved(cad::fuzz::Input& in) {
  SavedStamp saved;
  saved.plan = plan_stamp(in);
  saved.forward_call = in.take<uint8_t>() % 3;
  saved.softmax_scale = scale(in);
  const PlanStamp plan = plan_stamp(in);
  const bool planned = in.take<uint8_t>() % 2;
  CallShape call = shape(in);
  call.softmax_scale = scale(in);
  const uint64_t call_pieces = in.take<uint8_t>() % 3;
  const bool fits = (planned ? saved.plan.serial == plan.serial
                             : same_shape(saved.plan.shape, call) && saved.plan.local_pieces == call_pieces) &&
                    same_bits(saved.softmax_scale, call.softmax_scale);
  const auto check = [&] { check_saved_fits(saved, planned ? &plan : nullptr, call, call_pieces, "fuzz"); };
  if (accepted(check, "saved handle") != fits) {
    broken(fits ? "a saved state that fits its call refused" : "a saved state that does not fit its call accepted");
  }
  const uint64_t documents = in.take<uint8_t>() % 3;
  if (accepted([&] { check_saved_documents(saved, documents, "fuzz"); }, "saved handle") !=
      (saved.plan.documents == documents)) {
    broken("check_saved_documents disagrees with the documents' equality");
  }
}

void fuzz_tickets(cad::fuzz::Input& in) {
  std::vector<CallTicket> tickets(1 + in.take<uint8_t>() % 8);
  for (CallTicket& t : tickets) {
    t.call = in.take<uint8_t>() % 2;
    t.documents = in.take<uint8_t>() % 2;
    t.saved_forward = in.take<uint8_t>() % 2;
    t.softmax_scale = scale(in);
    t.kind = static_cast<int32_t>(in.take<uint8_t>() % 4);  // 3: not a kind, still compared
  }
  bool same = true;
  for (const CallTicket& t : tickets) {
    same = same && t.call == tickets[0].call && t.kind == tickets[0].kind && t.documents == tickets[0].documents &&
           t.saved_forward == tickets[0].saved_forward && same_bits(t.softmax_scale, tickets[0].softmax_scale);
  }
  if (accepted([&] { check_tickets(tickets, "fuzz"); }, "rank 0") != same) {
    broken(same ? "equal tickets refused" : "differing tickets accepted");
  }
}

// The fingerprints read every piece and task (ASan, UBSan) and are deterministic.
void fuzz_fingerprints(cad::fuzz::Input& in) {
  PieceTables tables(1 + in.take<uint8_t>() % 3);
  for (auto& table : tables) {
    const int n = in.take<uint8_t>() % 4;
    for (int i = 0; i < n; ++i) table.push_back({in.number(), in.number(), in.number(), in.number()});
  }
  std::vector<cad_task_v1_t> tasks(in.take<uint8_t>() % 4);
  for (auto& t : tasks) t = {in.number(), in.number(), in.number(), in.take<int32_t>(), 0};
  const CallShape s = shape(in);
  if (documents_fingerprint(tables, tasks, s) != documents_fingerprint(PieceTables(tables), tasks, s)) {
    broken("documents_fingerprint is not deterministic");
  }
  const auto& t0 = tables[0];
  if (pieces_fingerprint(t0.data(), static_cast<int64_t>(t0.size())) !=
      pieces_fingerprint(std::vector<cad_piece_v1_t>(t0).data(), static_cast<int64_t>(t0.size()))) {
    broken("pieces_fingerprint is not deterministic");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cad::fuzz::Input in(data, size);
  switch (in.take<uint8_t>() % 4) {
    case 0: fuzz_registry(in); break;
    case 1: fuzz_saved(in); break;
    case 2: fuzz_tickets(in); break;
    default: fuzz_fingerprints(in);
  }
  return 0;
}

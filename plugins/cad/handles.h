// handles.h -- what CAD's plan and saved handles were made for, and the checks every use makes.
//
// A handle crosses the C ABI as a bare pointer. Trusted as such, a stale or foreign one read past the
// saved buffers, gave wrong gradients without an error, or was freed twice. So:
//  - each instance keeps a registry of the handles it made and has not released: a pointer not in it is
//    refused without being dereferenced (released already, never made, or made by another instance);
//  - a handle carries a stamp of what it was made for (a serial unique in the process, the shape, a
//    fingerprint of the documents and of this rank's pieces; saved state also its forward's call number
//    and softmax_scale), compared with each call that uses it;
//  - where a call already agrees on the host (CPU and host-staged paths), every rank's CallTicket rides in
//    that agreement, so that ranks using different plans, scales or forwards' state all fail together.
// Pure: no communication and no instance, so that the unit tests and fuzzers drive it directly.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "cad_attention_v1.h"
#include "layout.h"
#include "validate.h"

namespace cad::cad_plugin {

// What a plan was made for.
struct PlanStamp {
  uint64_t serial = 0;        // next_handle_serial(): unique among every instance's plans in this process
  uint64_t documents = 0;     // documents_fingerprint(): equal on every rank of one plan
  uint64_t local_pieces = 0;  // pieces_fingerprint() of this rank's pieces
  CallShape shape;            // this rank's; softmax_scale unset (it is per call)
};

// What a forward's saved state was made by.
struct SavedStamp {
  PlanStamp plan;             // the plan that forward ran with (a one-shot plan is gone after it: its stamp stays)
  uint64_t forward_call = 0;  // that forward's call number on its instance: equal on every rank for one forward
  float softmax_scale = 0.0f; // the kept LSE was computed with it
};

// A serial unique across instances. The one process-wide mutable in CAD, on purpose: per-instance
// serials made two instances' first plans both #1, so one instance took the other's saved state.
uint64_t next_handle_serial();

// 64-bit FNV-1a fingerprints. Not cryptographic: they catch mistakes (another micro-batch, another layer's
// state), not forgeries.
uint64_t pieces_fingerprint(const cad_piece_v1_t* pieces, int64_t num_pieces);
// Every rank's pieces, the balancer's tasks and the shape that decides the layout (heads, head dim, dtype,
// causal, window_left): the same on every rank that made the plan together.
uint64_t documents_fingerprint(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks,
                               const CallShape& shape);

// A backward given saved state: does the state fit the call? With a plan (`plan` not NULL) the state must
// come from a forward with that very plan; without one, the call's shape and pieces (`call_pieces`, their
// fingerprint) must be the forward's, and the documents are compared once the call's one-shot plan exists
// (check_saved_documents). The softmax_scale must be the forward's either way. Throws INVALID_ARGUMENT
// naming the handle and what differs.
void check_saved_fits(const SavedStamp& saved, const PlanStamp* plan, const CallShape& call, uint64_t call_pieces,
                      const char* what);
void check_saved_documents(const SavedStamp& saved, uint64_t plan_documents, const char* what);

// The handles an instance made and has not released. Never dereferences a pointer it is asked about.
class HandleRegistry {
 public:
  explicit HandleRegistry(const char* kind) : kind_(kind) {}
  void add(const void* handle) { live_.insert(handle); }
  bool live(const void* handle) const { return live_.count(handle) != 0; }
  // False (and nothing changes) when `handle` is not live.
  bool remove(const void* handle) { return live_.erase(handle) != 0; }
  size_t size() const { return live_.size(); }
  // "<what>: <kind> handle 0x... is not live on this instance (...)".
  std::string not_live(const void* handle, const char* what) const;
  // Throws INVALID_ARGUMENT with not_live() unless `handle` is live.
  void check_live(const void* handle, const char* what) const;

 private:
  const char* kind_;
  std::unordered_set<const void*> live_;
};

// What each rank says about a call where the ranks already agree on the host, so that they also agree that
// it is the same call. Trivially copyable (it travels in an all_gather).
enum CallKind : int32_t { kMakePlan = 0, kForward = 1, kBackward = 2 };
struct CallTicket {
  uint64_t call = 0;           // the instance's count of forward and backward calls, this one included (0: make_plan)
  uint64_t documents = 0;      // the plan's documents_fingerprint (backward with saved state and no plan: the
                               // state's); 0 where there is none yet
  uint64_t saved_forward = 0;  // backward: the forward_call of the saved state it uses; 0 for none
  float softmax_scale = 0.0f;
  int32_t kind = kMakePlan;
};

// Throws INVALID_ARGUMENT (the same message on every rank, naming rank 0 and the first rank that differs from
// it, and in what) unless every rank's ticket is the same.
void check_tickets(const std::vector<CallTicket>& tickets, const char* what);

}  // namespace cad::cad_plugin

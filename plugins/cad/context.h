// context.h -- one CAD instance: its config, the three instances it borrows from the host
// (communicator, balancer, server backend), and what it keeps between forward and backward.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cad_plugin_v1.h"
#include "comm.h"
#include "handles.h"
#include "plan.h"
#include "plugin_support.h"
#include "stats.h"
#include "step.h"
#include "validate.h"

namespace cad::cad_plugin {

struct Config {
  std::string communicator;        // instance names in the host's config
  std::string plan_communicator;   // optional: make_plan's collectives go here (see CadContext::planning_comm)
  std::string balancer;
  std::string server_backend;
  std::string own_server_backend;  // optional: the instance that runs the tasks run in place (else server_backend)
  bool keep_forward_tensors = true;  // servers keep Q/K/V/O/LSE of the last forward for backward
  // The CUDA data path's communication stream: "highest" (the device's greatest priority) or "normal". See
  // device_runtime.cpp's runtime(): highest lets an exchange take the next free SMs instead of queueing behind
  // compute, but an exchange that then waits for a late peer holds them meanwhile.
  bool comm_stream_highest_priority = true;
  // A server runs the tasks on documents it holds whole in place on its own tensors (layout.h: Layout::own),
  // on the CUDA path while the moved rows are in flight, instead of sending them to itself through the exchange.
  // Off by default: measured no faster on 2 H200s (bench/results/trainer_h200x2_2026-11-27_{0a9366b,afdc6f0,c9c0322}).
  bool own_tasks_in_place = false;
  // The CUDA data path (NCCL) splits each call's heads into this many groups and pipelines them: the server
  // computes group g while group g+1's rows arrive and group g-1's results leave (schedule.h). 1: one exchange
  // per tensor, unsplit. Must divide Hq and Hkv; every rank must give the same number (agreed at each plan).
  int32_t head_groups = 1;
  PlanKnobs knobs;                   // min_shard_tokens, memory_cap_bytes for the balancer's cost model
};

struct ServerBackend {
  const cad_attention_v1_t* table = nullptr;
  void* instance = nullptr;
  std::string name;
  cad_attention_capabilities_v1_t caps{};
  // ABI v1.1 plans: the backend's work lists made once per CAD plan (graph-capturable calls).
  bool has_plans() const {
    return CAD_HAS_FIELD(cad_attention_v1_t, table, release_saved) && table->make_plan != nullptr &&
           table->release_plan != nullptr;
  }
};

// A CPU server batch kept from a forward for its backward (keep_forward_tensors), with the owner's own rows for
// the tasks it runs in place (its backward may be handed stand-ins for q/k/v/o: plugins/cad/README.md).
struct KeptBatch {
  std::vector<std::byte> q, k, v, o;
  std::vector<float> lse;
  std::vector<std::byte> own_q, own_k, own_v, own_o;
  std::vector<float> own_lse;
};

struct DeviceSaved;  // device_memory.h
struct DeviceSavedDeleter {
  CadContext* ctx = nullptr;
  void operator()(DeviceSaved* saved) const;
};

// What one forward leaves for its backward: the handle behind the ABI's `saved` (v1.1), or the
// instance's last forward for v1.0 hosts.
struct Saved {
  SavedStamp stamp;          // what it was made by, checked by the backward that uses it
  KeptBatch host;            // CPU data path
  std::unique_ptr<DeviceSaved, DeviceSavedDeleter> device;  // CUDA data path
};

// The last forward of a v1.0-style call (no plan, no saved slot), for its backward to recognise.
struct LastForward {
  PlanPtr plan;                  // the forward's one-shot plan
  std::unique_ptr<Saved> saved;  // NULL unless keep_forward_tensors
};

struct DeviceRuntime;  // device_runtime.h: the communication stream and its events
struct DeviceRuntimeDeleter {
  void operator()(DeviceRuntime* runtime) const;
};

struct CadContext : plugin::ErrorState {
  CadContext(const cad_host_services_v1_t* services, const char* config_json);

  plugin::Logger logger;
  Config config;
  std::unique_ptr<Comm> comm;
  // make_plan's collectives (agreement, piece tables, verdict) on a communicator of their own, so that plans can
  // be made ahead on another thread while this one's forward and backward exchange data on `comm`. Empty: `comm`.
  std::unique_ptr<Comm> plan_comm;
  Comm& planning_comm() { return plan_comm ? *plan_comm : *comm; }
  bool plans_concurrently() const { return plan_comm != nullptr; }
  // Thread safety. Every entry point holds `state_mutex` for its whole call, except make_plan with a plan
  // communicator: it holds `planning_mutex` (one make at a time) and takes `state_mutex` only around what it
  // shares with the other calls (the server backend's plan, device tables, the handle registry, stats), never
  // across a collective. Recursive: a release that a host collective's callback triggers on the same thread
  // (a Python garbage collection inside a call) must not deadlock.
  std::recursive_mutex state_mutex;
  std::mutex planning_mutex;
  BalancerRef balancer;
  ServerBackend server;
  ServerBackend own_server;  // runs the tasks a rank runs in place (Config::own_server_backend; else `server`)
  Accepts accepts;  // what the server backend takes, hence what CAD takes
  std::unique_ptr<LastForward> last_forward;
  Stats stats;
  // Forward and backward calls so far: every rank makes the same ones in the same order, so the count names
  // one call on every rank (CallTicket, SavedStamp::forward_call).
  uint64_t calls = 0;
  // The plan and saved handles this instance gave out and that are not released yet (handles.h).
  HandleRegistry plan_handles{"plan"};
  HandleRegistry saved_handles{"saved"};
  bool host_staged = false;  // CUDA tensors over a communicator on host memory (MPI): staged via pinned buffers
  std::unique_ptr<DeviceRuntime, DeviceRuntimeDeleter> device;  // created with the first CUDA plan
};

// The capabilities CAD reports: the server backend's, restricted to what the CPU data path moves.
cad_attention_capabilities_v1_t cad_capabilities(const CadContext& ctx);

}  // namespace cad::cad_plugin

// nccl_config.h -- the "nccl" plugin's JSON config.
#pragma once

#include <cstdint>
#include <string>

#include "plugin_support.h"

namespace cad::nccl_comm {

struct NcclConfig {
  int device = -1;                    // -1: the local rank (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK) or 0
  std::string bootstrap = "auto";     // "auto" | "host" | "mpi"
  int64_t timeout_ms = 60000;         // per operation, counted from the moment it is enqueued
  uint64_t chunk_bytes = 1ull << 30;  // largest single ncclSend/ncclRecv; larger messages are split
  // all_to_all_v first all-gathers every rank's counts and refuses mismatches on every rank alike.
  // Off by default: it waits for the stream (the call then no longer only enqueues).
  bool verify_counts = false;
  // A blocking NCCL communicator: about 50-100 us less host time per call (no background enqueue),
  // but a call whose enqueue waits for a peer that never comes (first use of a connection) blocks
  // the host with no deadline, and create has no deadline. Off by default.
  bool blocking_comm = false;
  // Create exchanges one byte with every peer (a grouped send/recv, waited for), so that NCCL sets up every
  // pair's connection then. NCCL connects send/recv peers on first use, which costs a few hundred ms per new
  // set of pairs, and CAD's plans change their pairs from step to step (docs/nccl.md: what that looked like
  // on 4 H200s). Off: connections stay lazy (less memory at large scale for pairs that never talk).
  bool connect_peers = true;
  // The most CTAs (thread blocks, one SM each) an operation of this communicator may use (ncclConfig_t.maxCTAs);
  // 0: NCCL's default. An all-to-all that runs beside compute (CAD's ping-pong) and waits for a late peer spins
  // on its SMs for that long, taking them from the compute it was meant to hide under; fewer CTAs bound that.
  int max_ctas = 0;
  // all_to_all_v through the GPUs' copy engines and CUDA IPC instead of NCCL's kernels (nccl_copy_engine.h): for
  // ranks on one host whose GPUs reach each other; no SM is used, so an exchange runs beside a persistent kernel.
  // Each rank holds 2 * world slots of copy_engine_slot_mib MiB. Off by default.
  bool copy_engines = false;
  int64_t copy_engine_slot_mib = 64;
};

NcclConfig read_config(const char* config_json, const plugin::Logger& logger);

// The CUDA device this rank uses: config "device", else the local rank from the launcher's
// environment (OMPI_COMM_WORLD_LOCAL_RANK, then LOCAL_RANK), else 0.
int choose_device(const NcclConfig& config);

}  // namespace cad::nccl_comm

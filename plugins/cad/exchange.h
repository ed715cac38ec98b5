// exchange.h -- moving rows between owners and servers: pack -> all_to_all_v -> unpack.
//
// One exchange moves several tensors ("parts") at once. The bytes for one peer are the parts one
// after another, each as the rows its run list names, in run order. Sender and receiver derive the
// same run lists from the same layout, so counts match by construction.
// pack() and unpack() are the only functions that touch tensor memory: a CUDA data path replaces
// them with gather/scatter kernels and keeps everything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "layout.h"

namespace cad::cad_plugin {

enum class RunSet { Q, KV };  // which run list of a route moves a part: query rows or key/value rows

enum class Direction {
  ToServers,  // owners send their rows (runs' src side) to the servers (dst side)
  ToOwners,   // servers send results (dst side) back to the owners (src side)
};

enum class Format {
  Rows,            // the tensor is [rows, row_bytes]; a row moves as-is
  LseColumns,      // the tensor is fp32 [lse_heads, lse_rows] (LSE): wire row t = its column t
  AccumulateRows,  // receive only: wire rows (fp32 or bf16) are ADDED into an fp32 [rows, ...] tensor
};

struct Part {
  RunSet runs = RunSet::Q;
  Format format = Format::Rows;
  std::byte* data = nullptr;  // this rank's tensor (read for sending, written for receiving)
  int64_t row_bytes = 0;      // bytes of one row on the wire
  int64_t lse_heads = 0;      // LseColumns only
  int64_t lse_rows = 0;       // LseColumns only: the tensor's second dim
  bool wire_bf16 = false;     // AccumulateRows only: wire elements are bf16 (else fp32)
};

// Byte counts and displacements of one all_to_all_v for this rank.
struct Transfer {
  std::vector<uint64_t> send_counts, send_displs, recv_counts, recv_displs;
  uint64_t send_bytes = 0;
  uint64_t recv_bytes = 0;
};

Transfer plan_transfer(const Layout& layout, int32_t me, Direction direction, const std::vector<Part>& send,
                       const std::vector<Part>& recv);

// Gathers this rank's rows of every send part into `buffer` (transfer.send_bytes bytes).
void pack(const Layout& layout, int32_t me, Direction direction, const std::vector<Part>& send,
          const Transfer& transfer, std::byte* buffer);

// Scatters `buffer` (transfer.recv_bytes bytes) into the receive parts. Peers are processed in rank
// order, so AccumulateRows sums the contributions of every peer in a fixed order (deterministic).
void unpack(const Layout& layout, int32_t me, Direction direction, const std::vector<Part>& recv,
            const Transfer& transfer, const std::byte* buffer);

// bf16 <-> fp32 (round to nearest even), for accumulating bf16 gradients in fp32.
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);

}  // namespace cad::cad_plugin

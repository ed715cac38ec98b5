// demo_common.h -- what both modes of `cad demo` share: fp32 CPU tensors over std::vector, the stack's
// communicator (rank, world, all_gather of doubles), status checks and timing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cad_host.hpp"

namespace cad::demo {

// A borrowed fp32 CPU tensor over a std::vector. Not copyable: `view` points into the vectors (a move
// keeps their buffers, so it stays valid).
struct Tensor {
  std::vector<float> data;
  std::vector<int64_t> shape;
  cad_tensor_v1_t view{};

  explicit Tensor(std::vector<int64_t> dims);
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Sum of |x| over finite entries: a checksum that, unlike a plain sum, does not cancel (the columns
  // of dK sum to zero analytically).
  double abs_sum() const;
  // Largest |x| over finite entries (0 if none).
  double max_abs() const;
};

// A communicator instance of a stack. Without one (a local stack, no mpirun) it is rank 0 of 1.
struct Communicator {
  const cad_communicator_v1_t* table = nullptr;
  void* instance = nullptr;
  int32_t rank = 0;
  int32_t world_size = 1;

  // Every rank's `mine` (the same length on every rank), rank after rank. Collective.
  std::vector<double> all_gather(const std::vector<double>& mine) const;
  // Collective; a no-op for a world of one.
  void barrier() const;
};

// The stack's first communicator instance, or rank 0 of 1 if it has none.
Communicator first_communicator(const cad::Host& host);
// The communicator instance called `name` (cad_host_find_instance); throws cad::Error if there is none.
Communicator communicator_named(const cad::Host& host, const std::string& name);

// Throws cad::Error naming `what`, the status and the instance's last error unless status is OK.
void require(cad_status_t status, const cad_attention_v1_t* table, void* instance, const std::string& what);

double milliseconds_since(std::chrono::steady_clock::time_point start);

// The default config: configs/reference.json in the working directory, the source tree or the install
// prefix.
std::string default_config();

}  // namespace cad::demo

// attention_tensors.h -- tensors the attention runner hands a backend: memory on the backend's device
// (host memory, or CUDA memory in a kit built with CUDA), element conversion fp64 <-> fp32/bf16, and
// sentinel fills that show whether a call wrote an output. Internal to the kit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cad_common_v1.h"

namespace cad::conformance {

enum class ElementType { F32, BF16 };
const char* element_name(ElementType type);
cad_dtype_v1_t element_dtype(ElementType type);
size_t element_bytes(ElementType type);
// The value nearest to x that the type can hold (bf16: round to nearest even).
double round_to(ElementType type, double x);

// Memory on the device the backend computes on. Methods throw std::runtime_error on failure.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual cad_device_v1_t device() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Wait for the work a backend enqueued (no-op on the CPU).
  virtual void synchronize() = 0;
};

// Memory for `device`; nullptr with *why_not set if this kit cannot reach that device.
std::unique_ptr<Memory> make_memory(cad_device_v1_t device, std::string* why_not);

// A compact row-major tensor owned by the runner, with the descriptor a backend borrows.
class Tensor {
 public:
  Tensor(Memory& memory, ElementType type, std::vector<int64_t> shape);
  ~Tensor();
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // The descriptor to pass; points into this object.
  cad_tensor_v1_t* desc() { return &desc_; }
  ElementType type() const { return type_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t numel() const { return numel_; }

  void upload(const std::vector<double>& values);  // values are converted (rounded) to the type
  std::vector<double> download() const;
  std::vector<uint8_t> raw() const;  // the bytes as they are on the device

  // Fill with a value no correct call writes (7777), so unwritten or wrongly written outputs show.
  void fill_sentinel();
  bool holds_sentinel() const;

 private:
  Memory& memory_;
  ElementType type_;
  std::vector<int64_t> shape_;
  size_t numel_ = 0;
  void* data_ = nullptr;
  cad_tensor_v1_t desc_{};
};

}  // namespace cad::conformance

// attention_tensors.cpp -- see attention_tensors.h.
#include "attention_tensors.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cuda_bridge.h"

namespace cad::conformance {

namespace {

constexpr double kSentinel = 7777.0;

uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return 0x7FC0;
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

class HostMemory : public Memory {
 public:
  cad_device_v1_t device() const override { return {CAD_DEVICE_CPU, 0}; }
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (p == nullptr) throw std::runtime_error("out of host memory");
    return p;
  }
  void release(void* ptr) override { std::free(ptr); }
  // Empty tensors come with a NULL host vector: memcpy must not see it, even for 0 bytes.
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}
};

class CudaMemory : public Memory {
 public:
  explicit CudaMemory(int device) : device_(device) {}
  cad_device_v1_t device() const override { return {CAD_DEVICE_CUDA, device_}; }
  void* allocate(size_t bytes) override {
    std::string error;
    void* p = cuda::allocate(device_, bytes, &error);
    if (p == nullptr) throw std::runtime_error(error);
    return p;
  }
  void release(void* ptr) override { cuda::release(ptr); }
  void upload(void* dst, const void* src, size_t bytes) override {
    std::string error;
    if (bytes > 0 && !cuda::copy_to_device(dst, src, bytes, &error)) throw std::runtime_error(error);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    std::string error;
    if (bytes > 0 && !cuda::copy_to_host(dst, src, bytes, &error)) throw std::runtime_error(error);
  }
  void synchronize() override {
    std::string error;
    if (!cuda::synchronize(&error)) throw std::runtime_error(error);
  }

 private:
  int device_;
};

}  // namespace

const char* element_name(ElementType type) { return type == ElementType::F32 ? "fp32" : "bf16"; }

cad_dtype_v1_t element_dtype(ElementType type) {
  return type == ElementType::F32 ? cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1}
                                  : cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1};
}

size_t element_bytes(ElementType type) { return type == ElementType::F32 ? 4 : 2; }

double round_to(ElementType type, double x) {
  const float f = static_cast<float>(x);
  return type == ElementType::F32 ? f : bf16_to_float(float_to_bf16(f));
}

std::unique_ptr<Memory> make_memory(cad_device_v1_t device, std::string* why_not) {
  if (device.device_type == CAD_DEVICE_CPU) return std::make_unique<HostMemory>();
  if (device.device_type == CAD_DEVICE_CUDA) {
    if (!cuda::built_with_cuda()) {
      *why_not = "CUDA backend, kit built without CUDA";
      return nullptr;
    }
    return std::make_unique<CudaMemory>(device.device_id);
  }
  *why_not = "unknown device type " + std::to_string(device.device_type);
  return nullptr;
}

Tensor::Tensor(Memory& memory, ElementType type, std::vector<int64_t> shape)
    : memory_(memory), type_(type), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t extent : shape_) numel_ *= static_cast<size_t>(extent);
  data_ = memory_.allocate(numel_ * element_bytes(type_));
  desc_.data = data_;
  desc_.device = memory_.device();
  desc_.ndim = static_cast<int32_t>(shape_.size());
  desc_.dtype = element_dtype(type_);
  desc_.shape = shape_.data();
  desc_.strides = nullptr;
  desc_.byte_offset = 0;
}

Tensor::~Tensor() { memory_.release(data_); }

void Tensor::upload(const std::vector<double>& values) {
  if (values.size() != numel_) throw std::logic_error("Tensor::upload: wrong number of values");
  std::vector<uint8_t> bytes(numel_ * element_bytes(type_));
  for (size_t i = 0; i < numel_; ++i) {
    const float f = static_cast<float>(values[i]);
    if (type_ == ElementType::F32) {
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      const uint16_t b = float_to_bf16(f);
      std::memcpy(&bytes[i * 2], &b, 2);
    }
  }
  memory_.upload(data_, bytes.data(), bytes.size());
}

std::vector<uint8_t> Tensor::raw() const {
  std::vector<uint8_t> bytes(numel_ * element_bytes(type_));
  memory_.download(bytes.data(), data_, bytes.size());
  return bytes;
}

std::vector<double> Tensor::download() const {
  const std::vector<uint8_t> bytes = raw();
  std::vector<double> values(numel_);
  for (size_t i = 0; i < numel_; ++i) {
    if (type_ == ElementType::F32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      values[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      values[i] = bf16_to_float(b);
    }
  }
  return values;
}

void Tensor::fill_sentinel() { upload(std::vector<double>(numel_, kSentinel)); }

bool Tensor::holds_sentinel() const {
  for (double x : download()) {
    if (x != round_to(type_, kSentinel)) return false;
  }
  return true;
}

}  // namespace cad::conformance

// fuzz_input.h -- reads typed values off a fuzzer's byte string (zeros once it runs out), and the one
// way a fuzz target reports a broken invariant: abort, which libFuzzer records as a crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cad::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <class T>
  T take() {
    T value{};
    const size_t n = pos_ < size_ ? (size_ - pos_ < sizeof(T) ? size_ - pos_ : sizeof(T)) : 0;
    if (n > 0) std::memcpy(&value, data_ + pos_, n);
    pos_ += sizeof(T);
    return value;
  }
  // Mostly small values (so that valid inputs are easy to reach), sometimes any int64.
  int64_t number() {
    const uint8_t mode = take<uint8_t>();
    const int64_t raw = take<int64_t>();
    if (mode % 4 == 0) return raw;
    return static_cast<int64_t>(static_cast<uint64_t>(raw) % 64) - (mode % 4 == 1 ? 8 : 0);
  }
  // A sliding-window limit: mostly the edges of int64 and of "no limit" (INT64_MAX, INT64_MAX - 1, -1, -2,
  // INT64_MIN, 0), sometimes small, sometimes any int64 -- where window arithmetic overflows.
  int64_t window_limit() {
    const uint8_t mode = take<uint8_t>();
    switch (mode % 8) {
      case 0: return INT64_MAX;
      case 1: return INT64_MAX - 1;
      case 2: return -1;
      case 3: return mode & 0x80 ? INT64_MIN : -2;
      case 4: return 0;
      case 5: return take<int64_t>();
      default: return static_cast<int64_t>(take<uint8_t>() % 80);
    }
  }
  bool empty() const { return pos_ >= size_; }
  std::string rest() const { return pos_ < size_ ? std::string(reinterpret_cast<const char*>(data_) + pos_, size_ - pos_) : ""; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

[[noreturn]] inline void broken(const std::string& invariant) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", invariant.c_str());
  std::abort();
}

}  // namespace cad::fuzz

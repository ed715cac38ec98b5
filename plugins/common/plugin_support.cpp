// plugin_support.cpp -- see plugin_support.h.
#include "plugin_support.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "checked_math.h"
#include "json_guard.h"
#include "nearest_key.h"

namespace cad::plugin {

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

void fail(cad_status_t status, const std::string& message) { throw Failure(status, message); }

bool Logger::enabled(cad_log_level_t level) const {
  return services_ != nullptr && services_->log != nullptr && level >= services_->log_level;
}

void Logger::log(cad_log_level_t level, const std::string& message) const {
  if (enabled(level)) services_->log(services_->host_ctx, level, source_.c_str(), message.c_str());
}

void copy_message(const std::string& message, char* buffer, size_t capacity) {
  if (buffer == nullptr || capacity == 0) return;
  const size_t n = std::min(message.size(), capacity - 1);
  std::memcpy(buffer, message.data(), n);
  buffer[n] = '\0';
}

void write_json_result(const std::string& json, char* buffer, size_t capacity, size_t* needed) {
  if (needed == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_stats_json: needed is NULL");
  if (buffer == nullptr && capacity > 0) fail(CAD_STATUS_INVALID_ARGUMENT, "get_stats_json: buffer is NULL");
  *needed = json.size() + 1;
  if (capacity < json.size() + 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("get_stats_json: buffer has %zu bytes, the statistics need %zu", capacity, json.size() + 1));
  }
  copy_message(json, buffer, capacity);
}

cad_status_t check_services(const cad_host_services_v1_t* services, std::string* message) {
  if (services == nullptr) {
    *message = "create: services is NULL (the host must lend a cad_host_services_v1_t)";
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  if (services->abi_major != CAD_ABI_VERSION_MAJOR) {
    *message = format("create: host ABI major %u, plugin ABI major %d", services->abi_major,
                      CAD_ABI_VERSION_MAJOR);
    return CAD_STATUS_ABI_MISMATCH;
  }
  // A v1.0 host's table is enough: v1.1 services (the host collectives) are read only where present.
  if (services->struct_size < CAD_HOST_SERVICES_V1_0_SIZE) {
    *message = format("create: services table is %zu bytes, this plugin needs %d (ABI v1.0)",
                      services->struct_size, CAD_HOST_SERVICES_V1_0_SIZE);
    return CAD_STATUS_ABI_MISMATCH;
  }
  return CAD_STATUS_OK;
}

// ---- ConfigReader -------------------------------------------------------------------------------

ConfigReader::ConfigReader(const char* config_json, std::string source) : source_(std::move(source)) {
  if (config_json == nullptr || config_json[0] == '\0') {
    json_ = nlohmann::json::object();
    return;
  }
  try {
    json_ = json_guard::parse(config_json, source_);  // depth-limited; errors name the key path
  } catch (const json_guard::JsonInputError& e) {
    fail(CAD_STATUS_INVALID_CONFIG, e.what());
  }
  if (!json_.is_object()) fail(CAD_STATUS_INVALID_CONFIG, source_ + ": expected a JSON object");
}

void ConfigReader::bad(const std::string& key, const std::string& expected) const {
  fail(CAD_STATUS_INVALID_CONFIG,
       source_ + ": key '" + key + "': expected " + expected + ", got " + json_.at(key).dump());
}

bool ConfigReader::has(const std::string& key) const { return json_.contains(key); }

int64_t ConfigReader::get_int(const std::string& key, int64_t fallback, int64_t min_value, int64_t max_value) {
  known_.insert(key);
  if (!json_.contains(key)) return fallback;
  const auto& v = json_.at(key);
  const std::string range = format("an integer in [%lld, %lld]", static_cast<long long>(min_value),
                                   static_cast<long long>(max_value));
  if (!v.is_number_integer()) bad(key, range);
  const int64_t x = v.get<int64_t>();
  if (x < min_value || x > max_value) bad(key, range);
  return x;
}

double ConfigReader::get_double(const std::string& key, double fallback, double min_value, double max_value) {
  known_.insert(key);
  if (!json_.contains(key)) return fallback;
  const auto& v = json_.at(key);
  const std::string range = format("a number in [%g, %g]", min_value, max_value);
  if (!v.is_number()) bad(key, range);
  const double x = v.get<double>();
  if (!(x >= min_value && x <= max_value)) bad(key, range);
  return x;
}

bool ConfigReader::get_bool(const std::string& key, bool fallback) {
  known_.insert(key);
  if (!json_.contains(key)) return fallback;
  if (!json_.at(key).is_boolean()) bad(key, "true or false");
  return json_.at(key).get<bool>();
}

std::string ConfigReader::get_string(const std::string& key, const std::string& fallback) {
  known_.insert(key);
  if (!json_.contains(key)) return fallback;
  if (!json_.at(key).is_string()) bad(key, "a string");
  return json_.at(key).get<std::string>();
}

std::string ConfigReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& allowed) {
  const std::string value = get_string(key, fallback);
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
    bad(key, "one of " + list);
  }
  return value;
}

nlohmann::json ConfigReader::get_json(const std::string& key) {
  known_.insert(key);
  return json_.contains(key) ? json_.at(key) : nlohmann::json();
}

void ConfigReader::finish(const Logger& logger) const {
  for (const auto& item : json_.items()) {
    if (known_.count(item.key()) == 0) {
      logger.warn(source_ + ": unknown key '" + item.key() + "' ignored" + keys::did_you_mean(item.key(), known_));
    }
  }
}

// ---- tensors ------------------------------------------------------------------------------------

const char* dtype_name(const cad_dtype_v1_t& d) {
  if (d.lanes == 1 && d.code == CAD_DTYPE_CODE_FLOAT && d.bits == 32) return "fp32";
  if (d.lanes == 1 && d.code == CAD_DTYPE_CODE_BFLOAT && d.bits == 16) return "bf16";
  if (d.lanes == 1 && d.code == CAD_DTYPE_CODE_FLOAT && d.bits == 16) return "fp16";
  if (d.lanes == 1 && d.code == CAD_DTYPE_CODE_FLOAT && d.bits == 64) return "fp64";
  return "an unsupported dtype";
}

bool dtype_is(const cad_dtype_v1_t& d, DType want) {
  if (d.lanes != 1) return false;
  switch (want) {
    case DType::F32: return d.code == CAD_DTYPE_CODE_FLOAT && d.bits == 32;
    case DType::BF16: return d.code == CAD_DTYPE_CODE_BFLOAT && d.bits == 16;
  }
  return false;
}

int64_t tensor_numel(const cad_tensor_v1_t* t) {
  // Only called on tensors check_tensor() accepted, whose size in bytes fits in int64.
  int64_t n = 0;
  return checked::product_bytes(t->shape, t->ndim, 1, &n) ? n : -1;
}

static const char* device_name(cad_device_type_t type) {
  return type == CAD_DEVICE_CPU ? "CPU" : type == CAD_DEVICE_CUDA ? "CUDA" : "an unknown device";
}

static std::string shape_string(const cad_tensor_v1_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->ndim; ++i) s += (i ? ", " : "") + std::to_string(t->shape[i]);
  return s + "]";
}

void check_tensor(const cad_tensor_v1_t* t, const TensorSpec& spec) {
  const std::string name = std::string("tensor '") + spec.name + "'";
  // Where a plan fixed the expected values, the message says so: the tensor more likely belongs to another
  // micro-batch or layer than it is malformed.
  const std::string fixed = spec.fixed_by == nullptr ? std::string()
                                                     : std::string(" (as ") + spec.fixed_by + " fixed: a plan from "
                                                           "another micro-batch or layer?)";
  if (t == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, name + " is NULL");
  if (t->device.device_type != spec.device_type) {
    fail(CAD_STATUS_INVALID_ARGUMENT, name + ": expected a " + device_name(spec.device_type) +
                                          " tensor, got a " + device_name(t->device.device_type) + " tensor");
  }
  const int want_rank = static_cast<int>(spec.shape.size());
  if (t->ndim != want_rank || (t->ndim > 0 && t->shape == nullptr)) {
    std::string dims;
    for (size_t i = 0; i < spec.dims.size(); ++i) dims += (i ? ", " : "") + std::string(spec.dims[i]);
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: expected %d dims [%s], got %d", name.c_str(), want_rank,
                                             dims.c_str(), t->ndim));
  }
  for (int i = 0; i < want_rank; ++i) {
    if (t->shape[i] < 0 || (spec.shape[i] >= 0 && t->shape[i] != spec.shape[i])) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("%s: dim %d (%s) is %lld, expected %lld%s; shape %s", name.c_str(), i, spec.dims[i],
                  static_cast<long long>(t->shape[i]), static_cast<long long>(spec.shape[i]), fixed.c_str(),
                  shape_string(t).c_str()));
    }
  }
  bool dtype_ok = false;
  std::string accepted;
  for (DType d : spec.dtypes) {
    dtype_ok = dtype_ok || dtype_is(t->dtype, d);
    accepted += (accepted.empty() ? "" : " or ") + std::string(d == DType::F32 ? "fp32" : "bf16");
  }
  if (!dtype_ok) {
    fail(CAD_STATUS_INVALID_ARGUMENT, name + ": expected dtype " + accepted + fixed + ", got " + dtype_name(t->dtype));
  }
  // Shape times element size, and data + byte_offset + that size, must be representable: a shape
  // whose byte count wraps would make every later bound check meaningless.
  int64_t bytes = 0;
  if (!checked::product_bytes(t->shape, want_rank, t->dtype.bits / 8, &bytes)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, name + ": shape " + shape_string(t) + " of " + dtype_name(t->dtype) +
                                          " holds more bytes than a 64-bit size can count");
  }
  const uint64_t start = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t->data));
  if (!checked::range_representable(start, t->byte_offset) ||
      !checked::range_representable(start + t->byte_offset, static_cast<uint64_t>(bytes))) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: data + byte_offset (%llu) + %lld bytes runs past the end of the "
                                             "address space", name.c_str(),
                                             static_cast<unsigned long long>(t->byte_offset),
                                             static_cast<long long>(bytes)));
  }
  // A tensor with no elements addresses no memory, so its strides say nothing: PyTorch gives an empty
  // [4, 0] tensor strides (1, 1), which the rule below would refuse (a rank with no tokens, issue 16).
  bool empty = false;
  for (int i = 0; i < want_rank; ++i) empty = empty || t->shape[i] == 0;
  if (t->strides != nullptr && !empty) {
    int64_t expect = 1;  // cannot overflow: the product of the non-zero extents fits (checked above)
    for (int i = want_rank - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expect) {
        fail(CAD_STATUS_INVALID_ARGUMENT, name + ": expected compact row-major strides (shape " +
                                              shape_string(t) + ")");
      }
      expect *= t->shape[i];
    }
  }
  if (t->data == nullptr && bytes > 0) fail(CAD_STATUS_INVALID_ARGUMENT, name + ": data is NULL");
}

void check_byte_layout(const char* side, const void* buffer, const uint64_t* counts, const uint64_t* displs,
                       int world) {
  if (counts == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("all_to_all_v: %s_counts is NULL", side));
  if (displs == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("all_to_all_v: %s_displs is NULL", side));
  const uint64_t base = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(buffer));
  for (int p = 0; p < world; ++p) {
    if (counts[p] == 0) continue;  // nothing is read or written: the displacement is never used
    if (buffer == nullptr) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("all_to_all_v: %s is NULL but %s_counts[%d] is %llu", side, side, p,
                                               static_cast<unsigned long long>(counts[p])));
    }
    if (!checked::range_representable(displs[p], counts[p]) ||
        !checked::range_representable(base, displs[p] + counts[p])) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("all_to_all_v: %s_displs[%d] (%llu) + %s_counts[%d] (%llu) runs past the end of the address space",
                  side, p, static_cast<unsigned long long>(displs[p]), side, p,
                  static_cast<unsigned long long>(counts[p])));
    }
  }
}

void check_segments(const cad_segment_v1_t* segments, int64_t num_segments, int64_t tq, int64_t tk,
                    bool causal) {
  if (num_segments < 0) fail(CAD_STATUS_INVALID_ARGUMENT, "num_segments is negative");
  if (num_segments > 0 && segments == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "segments is NULL");
  std::vector<int64_t> order(static_cast<size_t>(num_segments));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = 0; i < num_segments; ++i) {
    const cad_segment_v1_t& s = segments[i];
    const auto ll = [](int64_t x) { return static_cast<long long>(x); };
    if (!checked::range_within(s.q_offset, s.q_len, tq) || !checked::range_within(s.kv_offset, s.kv_len, tk)) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("segment %lld (q_offset %lld, q_len %lld, kv_offset %lld, kv_len %lld) is outside "
                  "Tq=%lld / Tk=%lld",
                  ll(i), ll(s.q_offset), ll(s.q_len), ll(s.kv_offset), ll(s.kv_len), ll(tq), ll(tk)));
    }
    if (causal && s.q_len > s.kv_len) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("segment %lld: causal attention needs q_len <= kv_len, got q_len %lld > kv_len %lld", ll(i),
                  ll(s.q_len), ll(s.kv_len)));
    }
  }
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return segments[a].q_offset < segments[b].q_offset; });
  int64_t covered_end = -1, covered_by = -1;  // furthest Q row reached by a non-empty segment so far
  for (int64_t index : order) {
    const cad_segment_v1_t& s = segments[index];
    if (s.q_len == 0) continue;
    if (s.q_offset < covered_end) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("segments %lld and %lld overlap in Q", static_cast<long long>(covered_by),
                                               static_cast<long long>(index)));
    }
    covered_end = s.q_offset + s.q_len;
    covered_by = index;
  }
}

}  // namespace cad::plugin

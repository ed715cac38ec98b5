// registry.cpp -- register / unregister / find, and the two exported C entry points around them.
#include "registry.h"

#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>

#include "plugin_support.h"

namespace cad::callback_attention {
namespace {

using cad::plugin::fail;
using cad::plugin::format;

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<Registration>> by_key;
};

// Function-local: made on first use, so no constructor runs at load time.
Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: a release at process exit would call freed code
  return *instance;
}

std::string checked_key(const char* key) {
  if (key == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "callback_attention: key is NULL");
  const size_t n = strnlen(key, CAD_CALLBACK_ATTENTION_MAX_KEY + 1);
  bool ok = n > 0 && n <= CAD_CALLBACK_ATTENTION_MAX_KEY;
  for (size_t i = 0; ok && i < n; ++i) {
    const char c = key[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  }
  if (!ok) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("callback_attention: key '%.*s' must be 1 to %d characters of "
                                             "[A-Za-z0-9_.-]", static_cast<int>(n), key, CAD_CALLBACK_ATTENTION_MAX_KEY));
  }
  return std::string(key, n);
}

void check_table(const std::string& key, const cad_callback_attention_v1_t& t) {
  const std::string where = "callback_attention: the table registered under '" + key + "'";
  if (t.version != CAD_CALLBACK_ATTENTION_VERSION) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s has version %u; this plugin implements version %d", where.c_str(),
                                         t.version, CAD_CALLBACK_ATTENTION_VERSION));
  }
  if (t.reserved != 0) fail(CAD_STATUS_INVALID_ARGUMENT, where + ": reserved must be 0");
  if (t.forward == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, where + ": forward is NULL");
  const cad_attention_capabilities_v1_t& c = t.capabilities;
  if (c.device_type != CAD_DEVICE_CPU && c.device_type != CAD_DEVICE_CUDA) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: capabilities.device_type is %d; expected CAD_DEVICE_CPU (1) or "
                                             "CAD_DEVICE_CUDA (2)", where.c_str(), c.device_type));
  }
  const uint32_t dtypes = CAD_ATTENTION_DTYPE_FP32 | CAD_ATTENTION_DTYPE_BF16;
  if (c.dtype_mask == 0 || (c.dtype_mask & ~dtypes) != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: capabilities.dtype_mask is 0x%x; expected a non-empty subset of "
                                             "FP32 | BF16 (0x3)", where.c_str(), c.dtype_mask));
  }
  if (c.flags & CAD_ATTENTION_CAP_PIECES) {
    fail(CAD_STATUS_INVALID_ARGUMENT, where + ": capabilities.flags has CAD_ATTENTION_CAP_PIECES; callbacks take "
                                              "segments");
  }
  if (!(c.flags & (CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL))) {
    fail(CAD_STATUS_INVALID_ARGUMENT, where + ": capabilities.flags has neither CAP_CAUSAL nor CAP_NONCAUSAL");
  }
  if ((c.flags & CAD_ATTENTION_CAP_BACKWARD) && t.backward == nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, where + ": capabilities.flags has CAD_ATTENTION_CAP_BACKWARD but backward is "
                                              "NULL");
  }
  if (c.max_head_dim <= 0 || c.head_dim_mask == 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: capabilities.max_head_dim (%d) and head_dim_mask (0x%x) must be "
                                             "positive", where.c_str(), c.max_head_dim, c.head_dim_mask));
  }
}

}  // namespace

Registration::~Registration() {
  if (table.release != nullptr) table.release(table.user_data);
}

void register_callbacks(const char* key_text, const cad_callback_attention_v1_t* callbacks) {
  const std::string key = checked_key(key_text);
  if (callbacks == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "callback_attention: callbacks is NULL");
  if (callbacks->struct_size < sizeof(cad_callback_attention_v1_t)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("callback_attention: callbacks.struct_size is %zu, version 1 needs %zu",
                                         callbacks->struct_size, sizeof(cad_callback_attention_v1_t)));
  }
  cad_callback_attention_v1_t table;
  std::memcpy(&table, callbacks, sizeof(table));  // a later host's longer table: the fields this plugin knows
  table.struct_size = sizeof(table);
  check_table(key, table);
  auto registration = std::make_shared<Registration>(key, table);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.by_key.count(key)) {
    registration->table.release = nullptr;  // refused: the caller keeps ownership, so no release
    fail(CAD_STATUS_INVALID_ARGUMENT, "callback_attention: key '" + key + "' is registered already; unregister it "
                                      "first");
  }
  r.by_key.emplace(key, std::move(registration));
}

void unregister_callbacks(const char* key_text) {
  const std::string key = checked_key(key_text);
  std::shared_ptr<Registration> gone;  // released after the lock: release may call back into the registry
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_key.find(key);
    if (it == r.by_key.end()) fail(CAD_STATUS_NOT_FOUND, "callback_attention: no callbacks are registered under '" + key + "'");
    gone = std::move(it->second);
    r.by_key.erase(it);
  }
}

std::shared_ptr<Registration> find(const std::string& key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_key.find(key);
  if (it != r.by_key.end()) return it->second;
  std::string keys;
  for (const auto& entry : r.by_key) keys += (keys.empty() ? "'" : ", '") + entry.first + "'";
  fail(CAD_STATUS_NOT_FOUND,
       "plugin 'callback_attention' config: no callbacks are registered under key '" + key + "' (registered: " +
           (keys.empty() ? std::string("none") : keys) + "); the host process registers them with " +
           CAD_CALLBACK_ATTENTION_REGISTER_SYMBOL_V1 + " before it creates the instance");
}

}  // namespace cad::callback_attention

namespace {

template <class Body>
cad_status_t entry(Body&& body, char* error, size_t error_capacity) noexcept {
  cad::plugin::ErrorState state;
  const cad_status_t status = cad::plugin::guarded(state, body);
  cad::plugin::copy_message(state.text(), error, error_capacity);
  return status;
}

}  // namespace

extern "C" CAD_PLUGIN_EXPORT cad_status_t cad_callback_attention_register_v1(const char* key,
                                                                             const cad_callback_attention_v1_t* callbacks,
                                                                             char* error, size_t error_capacity) {
  return entry([&] { cad::callback_attention::register_callbacks(key, callbacks); }, error, error_capacity);
}

extern "C" CAD_PLUGIN_EXPORT cad_status_t cad_callback_attention_unregister_v1(const char* key, char* error,
                                                                               size_t error_capacity) {
  return entry([&] { cad::callback_attention::unregister_callbacks(key); }, error, error_capacity);
}

// Both entry points have the types the header declares (a mismatch fails to compile here, not at dlsym).
static_assert(std::is_same_v<decltype(&cad_callback_attention_register_v1), cad_callback_attention_register_v1_fn>);
static_assert(std::is_same_v<decltype(&cad_callback_attention_unregister_v1), cad_callback_attention_unregister_v1_fn>);

// The callback_attention plugin through its ABI table and its registration API, loaded as it ships.
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cad/cad_host.h"
#include "cad_callback_attention_v1.h"
#include "conformance.h"

namespace {

struct Loaded {
  cad_library_t* library = nullptr;
  const cad_attention_v1_t* table = nullptr;
  void* dl = nullptr;  // the same object, opened again for its registration symbols
  cad_callback_attention_register_v1_fn register_fn = nullptr;
  cad_callback_attention_unregister_v1_fn unregister_fn = nullptr;
};

cad_library_t* open_library(const char* path) {
  cad_library_t* library = nullptr;
  char error[1024] = {0};
  EXPECT_EQ(cad_library_open(path, nullptr, &library, error, sizeof(error)), CAD_STATUS_OK) << error;
  return library;
}

Loaded& callback_plugin() {
  static Loaded loaded = [] {
    Loaded l;
    l.library = open_library(CAD_CALLBACK_PLUGIN_PATH);
    l.table = cad_library_plugin(l.library)->attention;
    l.dl = dlopen(cad_library_path(l.library), RTLD_NOW | RTLD_LOCAL);
    l.register_fn = reinterpret_cast<cad_callback_attention_register_v1_fn>(
        dlsym(l.dl, CAD_CALLBACK_ATTENTION_REGISTER_SYMBOL_V1));
    l.unregister_fn = reinterpret_cast<cad_callback_attention_unregister_v1_fn>(
        dlsym(l.dl, CAD_CALLBACK_ATTENTION_UNREGISTER_SYMBOL_V1));
    return l;
  }();
  return loaded;
}

// What the forwarding callbacks hold: the reference backend's instance, destroyed by `release`.
struct Forwarder {
  cad_library_t* library = nullptr;
  const cad_attention_v1_t* table = nullptr;
  void* instance = nullptr;
  cad::conformance::TestServices services;
  std::atomic<int> forwards{0}, backwards{0}, releases{0};
  uint32_t seen_window_flags = 0;
  size_t seen_struct_size = 0;
};

void copy_error(const char* text, char* error, size_t capacity) {
  if (capacity == 0) return;
  std::strncpy(error, text ? text : "", capacity - 1);
  error[capacity - 1] = '\0';
}

cad_status_t forward_to_reference(void* user, const cad_attention_forward_args_v1_t* args, char* error, size_t cap) {
  auto* f = static_cast<Forwarder*>(user);
  ++f->forwards;
  f->seen_window_flags = args->window_flags;
  f->seen_struct_size = args->struct_size;
  const cad_status_t status = f->table->forward(f->instance, args);
  if (status != CAD_STATUS_OK) copy_error(f->table->last_error(f->instance), error, cap);
  return status;
}

cad_status_t backward_to_reference(void* user, const cad_attention_backward_args_v1_t* args, char* error, size_t cap) {
  auto* f = static_cast<Forwarder*>(user);
  ++f->backwards;
  const cad_status_t status = f->table->backward(f->instance, args);
  if (status != CAD_STATUS_OK) copy_error(f->table->last_error(f->instance), error, cap);
  return status;
}

void release_forwarder(void* user) {
  auto* f = static_cast<Forwarder*>(user);
  ++f->releases;
  f->table->destroy(f->instance);
  f->instance = nullptr;
}

// A Forwarder with a reference instance, and the table that registers it.
cad_callback_attention_v1_t forwarding_table(Forwarder& f) {
  f.library = open_library(CAD_REFERENCE_PLUGIN_PATH);
  f.table = cad_library_plugin(f.library)->attention;
  char error[1024] = {0};
  EXPECT_EQ(f.table->create(f.services.table(), "{\"num_threads\": 2}", &f.instance, error, sizeof(error)),
            CAD_STATUS_OK) << error;
  cad_callback_attention_v1_t t;
  std::memset(&t, 0, sizeof(t));
  t.struct_size = sizeof(t);
  t.version = CAD_CALLBACK_ATTENTION_VERSION;
  t.capabilities.struct_size = sizeof(t.capabilities);
  EXPECT_EQ(f.table->get_capabilities(f.instance, &t.capabilities), CAD_STATUS_OK);
  t.user_data = &f;
  t.forward = forward_to_reference;
  t.backward = backward_to_reference;
  t.release = release_forwarder;
  return t;
}

std::string register_key(const char* key, const cad_callback_attention_v1_t& t, cad_status_t* status) {
  char error[1024] = {0};
  *status = callback_plugin().register_fn(key, &t, error, sizeof(error));
  return error;
}

struct Instance {
  cad::conformance::TestServices services;
  void* ctx = nullptr;
  cad_status_t status = CAD_STATUS_OK;
  std::string error;
  explicit Instance(const std::string& config) {
    char text[2048] = {0};
    status = callback_plugin().table->create(services.table(), config.c_str(), &ctx, text, sizeof(text));
    error = text;
  }
  ~Instance() { callback_plugin().table->destroy(ctx); }
};

TEST(Loading, ExportsTheRegistrationFunctions) {
  ASSERT_NE(callback_plugin().table, nullptr);
  ASSERT_NE(callback_plugin().register_fn, nullptr) << dlerror();
  ASSERT_NE(callback_plugin().unregister_fn, nullptr);
}

// The kit's whole attention runner (every dtype, causal and not, GQA, shared K/V, windows, length-0 and length-1
// segments, uncovered rows, empty batch, malformed calls refused with outputs untouched) through the callbacks.
TEST(Conformance, KitPassesThroughForwardingCallbacks) {
  auto* f = new Forwarder();  // freed after its release ran
  cad_status_t status;
  const std::string error = register_key("reference_forwarder", forwarding_table(*f), &status);
  ASSERT_EQ(status, CAD_STATUS_OK) << error;
  cad::conformance::Options options;
  options.plugin_path = CAD_CALLBACK_PLUGIN_PATH;
  options.config_json = "{\"key\": \"reference_forwarder\"}";
  cad::conformance::Report report;
  const cad_plugin_v1_t* plugin = cad_library_plugin(callback_plugin().library);
  ASSERT_TRUE(cad::conformance::check_plugin_table(plugin, options, report));
  cad::conformance::run_attention_conformance(plugin, options, report);
  std::string failures;
  bool shared_kv = false, uncovered = false, window = false;
  for (const auto& c : report.checks) {
    if (!c.passed) failures += c.name + ": " + c.detail + "\n";
    shared_kv |= c.passed && !c.skipped && c.name.find("shared") != std::string::npos;
    uncovered |= c.passed && !c.skipped && c.name.find("uncovered") != std::string::npos;
    window |= c.passed && !c.skipped && c.name.find("window") != std::string::npos;
  }
  EXPECT_EQ(report.failed(), 0) << failures;
  EXPECT_GT(report.passed(), 50);
  EXPECT_TRUE(shared_kv && uncovered && window) << "the kit ran no shared-K/V, uncovered-row or window case";
  EXPECT_GT(f->forwards.load(), 10);
  EXPECT_GT(f->backwards.load(), 10);
  EXPECT_EQ(f->seen_struct_size, sizeof(cad_attention_forward_args_v1_t));  // full v1.2 args whatever the caller's
  EXPECT_EQ(f->seen_window_flags, static_cast<uint32_t>(CAD_WINDOW_GIVEN));
  EXPECT_EQ(f->releases.load(), 0);
  ASSERT_EQ(callback_plugin().unregister_fn("reference_forwarder", nullptr, 0), CAD_STATUS_OK);
  EXPECT_EQ(f->releases.load(), 1);  // no instance left: released at once
  cad_library_close(f->library);
  delete f;
}

TEST(Registry, UnknownKeyAndMissingKeyAreRefusedWithTheirNames) {
  Instance unknown("{\"key\": \"nobody_registered_this\"}");
  EXPECT_EQ(unknown.status, CAD_STATUS_NOT_FOUND);
  EXPECT_NE(unknown.error.find("'nobody_registered_this'"), std::string::npos) << unknown.error;
  EXPECT_NE(unknown.error.find(CAD_CALLBACK_ATTENTION_REGISTER_SYMBOL_V1), std::string::npos) << unknown.error;
  Instance missing("{}");
  EXPECT_EQ(missing.status, CAD_STATUS_INVALID_CONFIG);
  EXPECT_NE(missing.error.find("'key' is required"), std::string::npos) << missing.error;
  Instance wrong_type("{\"key\": 3}");
  EXPECT_EQ(wrong_type.status, CAD_STATUS_INVALID_CONFIG);
}

cad_callback_attention_v1_t minimal_table(cad_callback_forward_fn forward) {
  cad_callback_attention_v1_t t;
  std::memset(&t, 0, sizeof(t));
  t.struct_size = sizeof(t);
  t.version = CAD_CALLBACK_ATTENTION_VERSION;
  t.capabilities.device_type = CAD_DEVICE_CPU;
  t.capabilities.dtype_mask = CAD_ATTENTION_DTYPE_FP32;
  t.capabilities.flags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_SHARED_KV;
  t.capabilities.head_dim_mask = 0xffff;
  t.capabilities.max_head_dim = 256;
  t.forward = forward;
  return t;
}

cad_status_t failing_forward(void*, const cad_attention_forward_args_v1_t*, char* error, size_t cap) {
  copy_error("the kernel ran out of shared memory", error, cap);
  return CAD_STATUS_DEVICE_ERROR;
}
cad_status_t bad_status_forward(void*, const cad_attention_forward_args_v1_t*, char*, size_t) { return 99; }

TEST(Registry, BadTablesAndKeysAreRefused) {
  cad_status_t status;
  auto t = minimal_table(failing_forward);
  std::string error = register_key("bad key!", t, &status);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error.find("[A-Za-z0-9_.-]"), std::string::npos) << error;
  auto v = t;
  v.version = 2;
  error = register_key("v2", v, &status);
  EXPECT_EQ(status, CAD_STATUS_ABI_MISMATCH);
  EXPECT_NE(error.find("version 2"), std::string::npos) << error;
  auto short_table = t;
  short_table.struct_size = 8;
  register_key("short", short_table, &status);
  EXPECT_EQ(status, CAD_STATUS_ABI_MISMATCH);
  auto no_forward = t;
  no_forward.forward = nullptr;
  error = register_key("no_forward", no_forward, &status);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error.find("forward is NULL"), std::string::npos) << error;
  auto no_backward = t;
  no_backward.capabilities.flags |= CAD_ATTENTION_CAP_BACKWARD;
  error = register_key("no_backward", no_backward, &status);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error.find("backward is NULL"), std::string::npos) << error;
  auto pieces = t;
  pieces.capabilities.flags |= CAD_ATTENTION_CAP_PIECES;
  register_key("pieces", pieces, &status);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT);
  // A key is taken once.
  register_key("taken", t, &status);
  ASSERT_EQ(status, CAD_STATUS_OK);
  error = register_key("taken", t, &status);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(error.find("registered already"), std::string::npos) << error;
  EXPECT_EQ(callback_plugin().unregister_fn("taken", nullptr, 0), CAD_STATUS_OK);
  char text[256];
  EXPECT_EQ(callback_plugin().unregister_fn("taken", text, sizeof(text)), CAD_STATUS_NOT_FOUND);
}

// One fp32 batch of one causal segment: q, k, v, o [2, 1, 16], lse [1, 2].
struct TinyBatch {
  std::vector<float> q = std::vector<float>(32, 0.5f), k = q, v = q, o = std::vector<float>(32, 7.f);
  std::vector<float> lse = std::vector<float>(2, 7.f);
  int64_t shape3[3] = {2, 1, 16}, shape2[2] = {1, 2};
  cad_tensor_v1_t tq{}, tk{}, tv{}, to{}, tl{};
  cad_segment_v1_t segment{0, 2, 0, 2};
  cad_attention_forward_args_v1_t args{};
  TinyBatch() {
    auto make = [](cad_tensor_v1_t& t, float* data, int64_t* shape, int ndim) {
      t.data = data;
      t.device = {CAD_DEVICE_CPU, 0};
      t.ndim = ndim;
      t.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
      t.shape = shape;
    };
    make(tq, q.data(), shape3, 3);
    make(tk, k.data(), shape3, 3);
    make(tv, v.data(), shape3, 3);
    make(to, o.data(), shape3, 3);
    make(tl, lse.data(), shape2, 2);
    args.struct_size = CAD_ATTENTION_FORWARD_ARGS_V1_0_SIZE;  // an old caller: the callback still sees v1.2
    args.segments = &segment;
    args.num_segments = 1;
    args.softmax_scale = 0.25f;
    args.causal = 1;
    args.q = &tq;
    args.k = &tk;
    args.v = &tv;
    args.o = &to;
    args.lse = &tl;
  }
};

TEST(Calls, FailingCallbackReturnsItsStatusAndMessage) {
  cad_status_t status;
  register_key("failing", minimal_table(failing_forward), &status);
  ASSERT_EQ(status, CAD_STATUS_OK);
  register_key("bad_status", minimal_table(bad_status_forward), &status);
  ASSERT_EQ(status, CAD_STATUS_OK);
  const cad_attention_v1_t* table = callback_plugin().table;
  {
    Instance failing("{\"key\": \"failing\"}");
    ASSERT_EQ(failing.status, CAD_STATUS_OK) << failing.error;
    TinyBatch b;
    EXPECT_EQ(table->forward(failing.ctx, &b.args), CAD_STATUS_DEVICE_ERROR);
    EXPECT_STREQ(table->last_error(failing.ctx),
                 "forward callback 'failing' failed: the kernel ran out of shared memory");
    // Without a registered backward: refused, and the capabilities do not claim one.
    cad_attention_capabilities_v1_t caps{};
    caps.struct_size = sizeof(caps);
    ASSERT_EQ(table->get_capabilities(failing.ctx, &caps), CAD_STATUS_OK);
    EXPECT_FALSE(caps.flags & CAD_ATTENTION_CAP_BACKWARD);
    cad_attention_backward_args_v1_t bwd{};
    bwd.struct_size = sizeof(bwd);
    EXPECT_EQ(table->backward(failing.ctx, &bwd), CAD_STATUS_UNSUPPORTED);
    // Refused before the callback: non-causal where only causal was registered, a stream on the CPU.
    b.args.causal = 0;
    EXPECT_EQ(table->forward(failing.ctx, &b.args), CAD_STATUS_UNSUPPORTED);
    b.args.causal = 1;
    b.args.stream = &b;
    EXPECT_EQ(table->forward(failing.ctx, &b.args), CAD_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(b.o[0], 7.f);  // untouched
  }
  {
    Instance bad("{\"key\": \"bad_status\"}");
    ASSERT_EQ(bad.status, CAD_STATUS_OK) << bad.error;
    TinyBatch b;
    EXPECT_EQ(table->forward(bad.ctx, &b.args), CAD_STATUS_INTERNAL);
    EXPECT_NE(std::string(table->last_error(bad.ctx)).find("status 99"), std::string::npos);
  }
  EXPECT_EQ(callback_plugin().unregister_fn("failing", nullptr, 0), CAD_STATUS_OK);
  EXPECT_EQ(callback_plugin().unregister_fn("bad_status", nullptr, 0), CAD_STATUS_OK);
}

// Unregistering stops new instances, not live ones; release comes when the last holder is gone.
TEST(Lifetime, LiveInstancesOutliveUnregisterAndReleaseComesLast) {
  auto* f = new Forwarder();
  cad_status_t status;
  register_key("lifetime", forwarding_table(*f), &status);
  ASSERT_EQ(status, CAD_STATUS_OK);
  auto* live = new Instance("{\"key\": \"lifetime\"}");
  ASSERT_EQ(live->status, CAD_STATUS_OK) << live->error;
  ASSERT_EQ(callback_plugin().unregister_fn("lifetime", nullptr, 0), CAD_STATUS_OK);
  EXPECT_EQ(f->releases.load(), 0);
  Instance after("{\"key\": \"lifetime\"}");
  EXPECT_EQ(after.status, CAD_STATUS_NOT_FOUND);
  TinyBatch b;
  ASSERT_EQ(callback_plugin().table->forward(live->ctx, &b.args), CAD_STATUS_OK)
      << callback_plugin().table->last_error(live->ctx);
  EXPECT_EQ(f->forwards.load(), 1);
  EXPECT_NEAR(b.o[0], 0.5f, 1e-6);  // equal rows of V: the output is that row
  delete live;
  EXPECT_EQ(f->releases.load(), 1);
  cad_library_close(f->library);
  delete f;
}

}  // namespace

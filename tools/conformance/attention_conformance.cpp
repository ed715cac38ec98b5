// attention_conformance.cpp -- the attention runner: capabilities, then numerics against the kit's
// oracle, capability refusals and argument errors (each in its own file), stats, and leaks.
#include <nlohmann/json.hpp>

#include "attention_internal.h"

namespace cad::conformance {

namespace {

constexpr uint32_t kKnownDtypes = CAD_ATTENTION_DTYPE_FP32 | CAD_ATTENTION_DTYPE_BF16;
constexpr uint32_t kKnownFlags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                                 CAD_ATTENTION_CAP_SHARED_KV | CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_PIECES |
                                 CAD_ATTENTION_CAP_WINDOW;

bool check_capabilities(Backend& b, Report& report) {
  b.caps = cad_attention_capabilities_v1_t{};
  b.caps.struct_size = sizeof(b.caps);
  const cad_status_t status = b.table->get_capabilities(b.ctx, &b.caps);
  if (!report.expect(status == CAD_STATUS_OK, "capabilities.get",
                     "get_capabilities returned " + status_name(status) + ": " + last_error_of(b.life, b.ctx))) {
    return false;
  }
  const cad_attention_capabilities_v1_t& c = b.caps;
  report.expect(c.device_type == CAD_DEVICE_CPU || c.device_type == CAD_DEVICE_CUDA, "capabilities.device_type",
                "device_type " + std::to_string(c.device_type) + " is neither CPU nor CUDA");
  report.expect(c.dtype_mask != 0 && (c.dtype_mask & ~kKnownDtypes) == 0, "capabilities.dtype_mask",
                "dtype_mask " + std::to_string(c.dtype_mask) + " is empty or has unknown bits");
  report.expect((c.flags & ~kKnownFlags) == 0 && (c.flags & (CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL)),
                "capabilities.flags",
                "flags " + std::to_string(c.flags) + " have unknown bits or neither causal nor non-causal");
  int64_t largest = 0;
  for (int bit = 0; bit < 32; ++bit) {
    if ((c.head_dim_mask >> bit) & 1u) largest = 16 * (bit + 1);
  }
  report.expect(largest > 0 && c.max_head_dim >= largest, "capabilities.head_dims",
                "head_dim_mask " + std::to_string(c.head_dim_mask) + " is empty or lists a head dim above max_head_dim " +
                    std::to_string(c.max_head_dim));
  report.expect(c.min_compute_capability >= 0, "capabilities.min_compute_capability", "negative");
  const cad_status_t null_status = b.table->get_capabilities(b.ctx, nullptr);
  report.expect(null_status != CAD_STATUS_OK, "capabilities.null_out",
                "get_capabilities(ctx, NULL) returned " + status_name(null_status));
  return true;
}

// get_stats_json is optional; when present it must follow its buffer protocol and produce a JSON object.
void check_stats(Backend& b, Report& report) {
  if (b.table->get_stats_json == nullptr) return;
  size_t needed = 0;
  char tiny[1] = {'x'};
  cad_status_t status = b.table->get_stats_json(b.ctx, tiny, sizeof(tiny), &needed);
  if (needed <= 1) {
    report.expect(status == CAD_STATUS_OK, "stats.buffer_too_small", "a stats string that fits must return OK");
    return;
  }
  if (!report.expect(status == CAD_STATUS_INVALID_ARGUMENT, "stats.buffer_too_small",
                     "a 1-byte buffer for " + std::to_string(needed) + " bytes must return INVALID_ARGUMENT")) {
    return;
  }
  std::string text(needed, '\0');
  size_t needed_again = 0;
  status = b.table->get_stats_json(b.ctx, text.data(), text.size(), &needed_again);
  if (!report.expect(status == CAD_STATUS_OK && needed_again == needed && text.back() == '\0', "stats.protocol",
                     "second call with the size the first reported returned " + status_name(status))) {
    return;
  }
  text.pop_back();
  bool object = false;
  try {
    object = nlohmann::json::parse(text).is_object();
  } catch (const nlohmann::json::exception&) {
  }
  report.expect(object, "stats.json", "get_stats_json did not give a JSON object: " + text.substr(0, 200));
}

}  // namespace

void run_attention_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report) {
  if (!report.expect(plugin != nullptr && plugin->kind == CAD_PLUGIN_KIND_ATTENTION && plugin->attention != nullptr,
                     "attention.kind", "not an attention plugin")) {
    return;
  }
  try {
    TestServices services;
    services.add_instances(options.instances);
    {
      std::unique_ptr<Instance> instance = create_for_run(plugin, options, services, "attention.create", report);
      if (!instance) return;
      Backend b;
      b.table = plugin->attention;
      b.ctx = instance->get();
      lifecycle_of(plugin, &b.life);
      if (!check_capabilities(b, report)) return;
      if (b.has(CAD_ATTENTION_CAP_PIECES)) {
        report.skip("attention.numerics", "distributed backend (tested under mpirun)");
        return;
      }
      std::string why_not;
      std::unique_ptr<Memory> memory = make_memory(cad_device_v1_t{b.caps.device_type, 0}, &why_not);
      if (!memory) {
        report.skip("attention.numerics", why_not);
        return;
      }
      b.memory = memory.get();
      check_numerics(b, options, report);
      check_capability_refusals(b, report);
      check_argument_errors(b, report);
      check_stats(b, report);
    }
    report.expect(services.outstanding_bytes() == 0, "attention.no_leak",
                  std::to_string(services.outstanding_bytes()) + " bytes of host allocations still held after destroy");
  } catch (const std::exception& e) {
    report.fail("attention.kit_error", std::string("the kit could not finish: ") + e.what());
  }
}

}  // namespace cad::conformance

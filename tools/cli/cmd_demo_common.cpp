// cmd_demo_common.cpp -- see demo_common.h. (Named cmd_demo_*.cpp so that the `cad` target's glob
// compiles it; it registers no command.)
#include "demo_common.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace cad::demo {

Tensor::Tensor(std::vector<int64_t> dims) : shape(std::move(dims)) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  data.assign(static_cast<size_t>(n), 0.0f);
  view.data = data.data();
  view.device = {CAD_DEVICE_CPU, 0};
  view.ndim = static_cast<int32_t>(shape.size());
  view.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
  view.shape = shape.data();
  view.strides = nullptr;
  view.byte_offset = 0;
}

double Tensor::abs_sum() const {
  double s = 0;
  for (float x : data) {
    if (std::isfinite(x)) s += std::fabs(x);
  }
  return s;
}

double Tensor::max_abs() const {
  double m = 0;
  for (float x : data) {
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  }
  return m;
}

std::vector<double> Communicator::all_gather(const std::vector<double>& mine) const {
  if (table == nullptr || world_size == 1) return mine;
  std::vector<double> all(mine.size() * static_cast<size_t>(world_size));
  const cad_status_t status =
      table->all_gather(instance, mine.data(), mine.size() * sizeof(double), all.data(), nullptr);
  if (status != CAD_STATUS_OK) {
    throw cad::Error(status, std::string("communicator all_gather failed: ") + cad::last_error_of(table, instance));
  }
  return all;
}

void Communicator::barrier() const {
  if (table == nullptr || world_size == 1) return;
  const cad_status_t status = table->barrier(instance, nullptr);
  if (status != CAD_STATUS_OK) {
    throw cad::Error(status, std::string("communicator barrier failed: ") + cad::last_error_of(table, instance));
  }
}

namespace {

Communicator describe(const cad_communicator_v1_t* table, void* instance, const std::string& name) {
  Communicator comm;
  if (table->get_rank(instance, &comm.rank) != CAD_STATUS_OK ||
      table->get_world_size(instance, &comm.world_size) != CAD_STATUS_OK || comm.world_size < 1 ||
      comm.rank < 0 || comm.rank >= comm.world_size) {
    throw cad::Error(CAD_STATUS_INTERNAL, "communicator '" + name + "' reports no valid rank/world size");
  }
  comm.table = table;
  comm.instance = instance;
  return comm;
}

}  // namespace

Communicator first_communicator(const cad::Host& host) {
  const int64_t count = cad_host_num_instances(host.get());
  for (int64_t i = 0; i < count; ++i) {
    cad_host_instance_info_v1_t info{};
    info.struct_size = sizeof info;
    if (cad_host_instance_info(host.get(), i, &info) != CAD_STATUS_OK) continue;
    if (info.plugin->kind != CAD_PLUGIN_KIND_COMMUNICATOR) continue;
    return describe(static_cast<const cad_communicator_v1_t*>(info.table), info.instance, info.name);
  }
  return Communicator{};
}

Communicator communicator_named(const cad::Host& host, const std::string& name) {
  const auto [table, instance] = host.find<cad_communicator_v1_t>(name, CAD_PLUGIN_KIND_COMMUNICATOR);
  return describe(table, instance, name);
}

void require(cad_status_t status, const cad_attention_v1_t* table, void* instance, const std::string& what) {
  if (status != CAD_STATUS_OK) {
    throw cad::Error(status, what + " failed [" + cad_status_name(status) + "]: " + cad::last_error_of(table, instance));
  }
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::string default_config() {
  const std::vector<std::string> candidates = {"configs/reference.json",
#ifdef CAD_SOURCE_CONFIG_DIR
                                               CAD_SOURCE_CONFIG_DIR "/reference.json",
#endif
#ifdef CAD_INSTALL_CONFIG_DIR
                                               CAD_INSTALL_CONFIG_DIR "/reference.json",
#endif
  };
  for (const auto& c : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(c, ec)) return c;
  }
  return candidates.front();
}

}  // namespace cad::demo

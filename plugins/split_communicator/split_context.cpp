// split_context.cpp -- see split_context.h.
#include "split_context.h"

#include <chrono>
#include <climits>
#include <vector>

namespace cad::split_comm {

using plugin::fail;
using plugin::format;

namespace {

const char* const kSource = "plugin 'split' config";

// Borrows the communicator instance the config names under `key`. `rank` is this process's rank where known
// (the bootstrap rank, or the first borrowed instance's), -1 where not.
Borrowed borrow(const cad_host_services_v1_t* services, plugin::ConfigReader& reader, const char* key, int rank) {
  const std::string where = rank >= 0 ? format(" (rank %d)", rank) : std::string();
  Borrowed b;
  b.key = key;
  b.name = reader.get_string(key, "");
  if (b.name.empty()) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s%s: key '%s' is missing: expected the name of a communicator instance "
                                           "listed before this one in the host's config", kSource, where.c_str(), key));
  }
  if (services->lookup_plugin == nullptr) {
    fail(CAD_STATUS_NOT_FOUND, format("%s%s: key '%s': the host lends no lookup_plugin service, so the communicator "
                                      "instance '%s' cannot be found", kSource, where.c_str(), key, b.name.c_str()));
  }
  const void* table = nullptr;
  const cad_status_t status =
      services->lookup_plugin(services->host_ctx, b.name.c_str(), CAD_PLUGIN_KIND_COMMUNICATOR, &table, &b.ctx);
  if (status != CAD_STATUS_OK || table == nullptr) {
    fail(CAD_STATUS_NOT_FOUND, format("%s%s: key '%s': no communicator instance named '%s' (it must be listed before "
                                      "the split instance in the host's config)", kSource, where.c_str(), key,
                                      b.name.c_str()));
  }
  b.table = static_cast<const cad_communicator_v1_t*>(table);
  if (b.table->struct_size < sizeof(cad_communicator_v1_t) || b.table->get_rank == nullptr ||
      b.table->get_world_size == nullptr || b.table->get_device == nullptr || b.table->all_to_all_v == nullptr ||
      b.table->all_gather == nullptr || b.table->barrier == nullptr || b.table->last_error == nullptr) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s%s: key '%s': communicator instance '%s' lacks functions of the v1 table",
                                         kSource, where.c_str(), key, b.name.c_str()));
  }
  return b;
}

// The rank, world size and device of a borrowed instance (these never fail on a live instance).
void describe(const Borrowed& b, int32_t* rank, int32_t* world, cad_device_v1_t* device) {
  if (b.table->get_rank(b.ctx, rank) != CAD_STATUS_OK || b.table->get_world_size(b.ctx, world) != CAD_STATUS_OK ||
      b.table->get_device(b.ctx, device) != CAD_STATUS_OK) {
    const char* e = b.table->last_error(b.ctx);
    fail(CAD_STATUS_COMMUNICATION, format("%s: key '%s': communicator instance '%s' did not give its rank, world size "
                                          "and device: %s", kSource, b.key.c_str(), b.name.c_str(), e ? e : "(no message)"));
  }
}

// What one borrowed call returned: its status and, on failure, the instance's message.
struct Outcome {
  cad_status_t status = CAD_STATUS_OK;
  std::string message;
};

Outcome outcome_of(const Borrowed& b, cad_status_t status) {
  Outcome o;
  o.status = status;
  if (status != CAD_STATUS_OK) {
    const char* e = b.table->last_error(b.ctx);
    o.message = e != nullptr && e[0] != '\0' ? e : "(no message)";
  }
  return o;
}

// One half of a split all_to_all_v: the counts of the peers this half carries, zero for the others. Held on the
// heap: the cross-node half may outlive a call that gave up waiting for it.
struct Half {
  std::vector<uint64_t> send_counts, recv_counts;
  Outcome outcome;
};

std::shared_ptr<Half> half(const uint64_t* send_counts, const uint64_t* recv_counts, int world, int rank,
                           int ranks_per_node, bool across) {
  auto h = std::make_shared<Half>();
  h->send_counts.assign(static_cast<size_t>(world), 0);
  h->recv_counts.assign(static_cast<size_t>(world), 0);
  for (int p = 0; p < world; ++p) {
    const bool other_node = p / ranks_per_node != rank / ranks_per_node;
    if (other_node != across) continue;
    h->send_counts[static_cast<size_t>(p)] = send_counts[p];
    h->recv_counts[static_cast<size_t>(p)] = recv_counts[p];
  }
  return h;
}

}  // namespace

SplitContext::SplitContext(const cad_host_services_v1_t* services, const char* config_json)
    : logger_(services, "split") {
  plugin::ConfigReader reader(config_json, kSource);
  timeout_ms_ = reader.get_int("timeout_ms", timeout_ms_, 1, 7LL * 24 * 3600 * 1000);
  if (!reader.has("ranks_per_node")) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s: key 'ranks_per_node' is missing: expected an integer >= 1 (ranks r and s "
                                           "share a node iff r / ranks_per_node == s / ranks_per_node)", kSource));
  }
  ranks_per_node_ = static_cast<int32_t>(reader.get_int("ranks_per_node", 1, 1, INT_MAX));
  const int known_rank = services->bootstrap_rank;
  intra_ = borrow(services, reader, "intra", known_rank);
  int32_t intra_world = 0;
  describe(intra_, &rank_, &intra_world, &device_);
  world_ = intra_world;
  inter_ = borrow(services, reader, "inter", rank_);
  if (inter_.name == intra_.name) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s (rank %d): keys 'intra' and 'inter' both name '%s': the two halves run at "
                                           "once, so they need two instances", kSource, rank_, intra_.name.c_str()));
  }
  int32_t inter_rank = -1, inter_world = 0;
  cad_device_v1_t inter_device{};
  describe(inter_, &inter_rank, &inter_world, &inter_device);
  if (inter_rank != rank_ || inter_world != world_) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("%s: key 'inter': instance '%s' is rank %d of %d but 'intra' instance '%s' is rank %d of %d; both must "
                "span the same ranks in the same order", kSource, inter_.name.c_str(), inter_rank, inter_world,
                intra_.name.c_str(), rank_, world_));
  }
  if (inter_device.device_type != device_.device_type || inter_device.device_id != device_.device_id) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("%s (rank %d): key 'inter': instance '%s' moves memory of device type %d id %d but 'intra' instance '%s' "
                "of device type %d id %d; both must use the same buffers", kSource, rank_, inter_.name.c_str(),
                inter_device.device_type, inter_device.device_id, intra_.name.c_str(), device_.device_type,
                device_.device_id));
  }
  if (world_ % ranks_per_node_ != 0) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s (rank %d): key 'ranks_per_node' is %d, which does not divide the world "
                                           "size %d of '%s' (every node must be whole)", kSource, rank_,
                                           ranks_per_node_, world_, intra_.name.c_str()));
  }
  const bool concurrent = reader.get_bool("concurrent", true);
  reader.finish(logger_);
  if (device_.device_type == CAD_DEVICE_CPU && concurrent) worker_ = std::make_unique<Worker>();
  if (device_.device_type == CAD_DEVICE_CUDA) fork_ = std::make_unique<StreamFork>(device_.device_id);
  logger_.debug(format("rank %d of %d: nodes of %d; pairs inside a node over '%s', across nodes over '%s'", rank_,
                       world_, ranks_per_node_, intra_.name.c_str(), inter_.name.c_str()));
}

std::string SplitContext::who() const { return format("plugin 'split' (rank %d)", rank_); }

void SplitContext::check_usable(void* stream, const char* operation) const {
  if (device_.device_type == CAD_DEVICE_CPU && stream != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: %s: stream must be NULL: instances '%s' and '%s' are CPU "
                                             "communicators (buffers are host memory)", who().c_str(), operation,
                                             intra_.name.c_str(), inter_.name.c_str()));
  }
  if (!broken_reason_.empty()) {
    fail(CAD_STATUS_COMMUNICATION, who() + ": the instance is unusable after an earlier failure: " + broken_reason_);
  }
}

void SplitContext::broken(cad_status_t status, const std::string& message) {
  broken_reason_ = message;
  fail(status, message);
}

void SplitContext::all_to_all_v(const void* send, const uint64_t* send_counts, const uint64_t* send_displs, void* recv,
                                const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
  check_usable(stream, "all_to_all_v");
  plugin::check_byte_layout("send", send, send_counts, send_displs, world_);
  plugin::check_byte_layout("recv", recv, recv_counts, recv_displs, world_);
  std::shared_ptr<Half> local = half(send_counts, recv_counts, world_, rank_, ranks_per_node_, false);
  std::shared_ptr<Half> cross = half(send_counts, recv_counts, world_, rank_, ranks_per_node_, true);
  const Borrowed inter = inter_;
  auto run_cross = [cross, inter, send, send_displs = std::vector<uint64_t>(send_displs, send_displs + world_), recv,
                    recv_displs = std::vector<uint64_t>(recv_displs, recv_displs + world_)](void* on) {
    cross->outcome = outcome_of(inter, inter.table->all_to_all_v(inter.ctx, send, cross->send_counts.data(),
                                                                 send_displs.data(), recv, cross->recv_counts.data(),
                                                                 recv_displs.data(), on));
  };
  const auto started = std::chrono::steady_clock::now();
  if (worker_) {
    // CPU instances block until their bytes moved: the cross-node half runs on the worker meanwhile.
    worker_->start([run_cross] { run_cross(nullptr); });
    local->outcome = outcome_of(intra_, intra_.table->all_to_all_v(intra_.ctx, send, local->send_counts.data(),
                                                                   send_displs, recv, local->recv_counts.data(),
                                                                   recv_displs, stream));
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    const auto left = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(timeout_ms_) - elapsed,
                                                          std::chrono::milliseconds(0));
    if (!worker_->wait_for(left)) {
      broken(CAD_STATUS_TIMEOUT,
             format("%s: all_to_all_v: the cross-node pairs over '%s' (key 'inter') did not finish within timeout_ms %lld%s",
                    who().c_str(), inter_.name.c_str(), static_cast<long long>(timeout_ms_),
                    local->outcome.status == CAD_STATUS_OK ? "" : ("; the pairs inside the node over '" + intra_.name +
                                                                   "' failed too: " + local->outcome.message).c_str()));
    }
  } else if (fork_) {
    // Stream instances only enqueue: the node-local half on the caller's stream, the cross-node half on the side
    // stream forked from it, joined back before anything the caller enqueues next (no host wait).
    void* side = fork_->fork(stream);
    local->outcome = outcome_of(intra_, intra_.table->all_to_all_v(intra_.ctx, send, local->send_counts.data(),
                                                                   send_displs, recv, local->recv_counts.data(),
                                                                   recv_displs, stream));
    if (local->outcome.status == CAD_STATUS_OK) run_cross(side);
    fork_->join(stream);
  } else {
    // "concurrent": false on CPU instances: one after the other on this thread (each bounded by its own
    // instance's timeout).
    local->outcome = outcome_of(intra_, intra_.table->all_to_all_v(intra_.ctx, send, local->send_counts.data(),
                                                                   send_displs, recv, local->recv_counts.data(),
                                                                   recv_displs, stream));
    if (local->outcome.status == CAD_STATUS_OK) run_cross(stream);
  }
  std::string failures;
  cad_status_t status = CAD_STATUS_OK;
  for (const auto& [part, b] : {std::pair<const Half*, const Borrowed*>{local.get(), &intra_}, {cross.get(), &inter_}}) {
    if (part->outcome.status == CAD_STATUS_OK) continue;
    if (status == CAD_STATUS_OK) status = part->outcome.status;
    failures += format("%s the pairs %s over '%s' (key '%s') failed: %s", failures.empty() ? "" : ";",
                       b == &intra_ ? "inside the node" : "across nodes", b->name.c_str(), b->key.c_str(),
                       part->outcome.message.c_str());
  }
  if (status != CAD_STATUS_OK) broken(status, who() + ": all_to_all_v:" + failures);
}

void SplitContext::all_gather(const void* send, uint64_t bytes, void* recv, void* stream) {
  check_usable(stream, "all_gather");
  const Outcome o = outcome_of(intra_, intra_.table->all_gather(intra_.ctx, send, bytes, recv, stream));
  if (o.status != CAD_STATUS_OK) {
    broken(o.status, format("%s: all_gather over '%s' (key 'intra') failed: %s", who().c_str(), intra_.name.c_str(),
                            o.message.c_str()));
  }
}

void SplitContext::barrier(void* stream) {
  check_usable(stream, "barrier");
  const Outcome o = outcome_of(intra_, intra_.table->barrier(intra_.ctx, stream));
  if (o.status != CAD_STATUS_OK) {
    broken(o.status, format("%s: barrier over '%s' (key 'intra') failed: %s", who().c_str(), intra_.name.c_str(),
                            o.message.c_str()));
  }
}

}  // namespace cad::split_comm

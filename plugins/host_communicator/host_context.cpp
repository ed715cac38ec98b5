// host_context.cpp -- see host_context.h.
#include "host_context.h"

#include <cstring>
#include <vector>

namespace cad::host_comm {

using plugin::fail;
using plugin::format;

namespace {

HostCommConfig read_config(const char* config_json, const plugin::Logger& logger) {
  plugin::ConfigReader reader(config_json, "plugin 'host' config");
  HostCommConfig config;
  config.timeout_ms = reader.get_int("timeout_ms", config.timeout_ms, 1, 7LL * 24 * 3600 * 1000);
  config.verify_counts = reader.get_bool("verify_counts", config.verify_counts);
  reader.finish(logger);
  return config;
}

bool host_lends_collectives(const cad_host_services_v1_t* s) {
  return CAD_HAS_FIELD(cad_host_services_v1_t, s, host_barrier) && s->host_all_to_all_v != nullptr &&
         s->host_all_gather != nullptr && s->host_barrier != nullptr;
}

}  // namespace

HostCommContext::HostCommContext(const cad_host_services_v1_t* services, const char* config_json)
    : services_(services), logger_(services, "host"), config_(read_config(config_json, logger_)) {
  if (!host_lends_collectives(services)) {
    fail(CAD_STATUS_UNSUPPORTED,
         "the host lends no collectives (services->host_all_to_all_v, host_all_gather, host_barrier, ABI v1.1): "
         "the 'host' communicator forwards to them; lend them through cad_host_options_v1_t (the Python package "
         "cad does, from torch.distributed), or use the 'mpi' communicator under mpirun");
  }
  rank_ = services->bootstrap_rank;
  world_ = services->bootstrap_world_size;
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    fail(CAD_STATUS_INVALID_CONFIG, format("the host lends collectives but its rank %d of world %d is not valid "
                                           "(services->bootstrap_rank / bootstrap_world_size)", rank_, world_));
  }
  logger_.debug(format("rank %d of %d, collectives lent by the host, timeout %lld ms", rank_, world_,
                       static_cast<long long>(config_.timeout_ms)));
}

void HostCommContext::check_usable() const {
  if (!broken_reason_.empty()) {
    fail(CAD_STATUS_COMMUNICATION, "the instance is unusable after an earlier failure: " + broken_reason_);
  }
}

template <class Call>
void HostCommContext::call_host(const char* operation, Call&& call) {
  check_usable();
  char message[512] = {0};
  const cad_status_t status = call(message, sizeof message);
  if (status == CAD_STATUS_OK) return;
  message[sizeof message - 1] = '\0';
  std::string reason = format("%s (rank %d of %d): the host's collective failed with %s: %s", operation, rank_, world_,
                              status == CAD_STATUS_TIMEOUT ? "TIMEOUT" : "an error",
                              message[0] != '\0' ? message : "(no message)");
  broken_reason_ = reason;
  fail(status == CAD_STATUS_TIMEOUT ? CAD_STATUS_TIMEOUT : CAD_STATUS_COMMUNICATION, reason);
}

void HostCommContext::all_to_all_v(const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                                   void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs) {
  if (send_counts == nullptr || send_displs == nullptr || recv_counts == nullptr || recv_displs == nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "all_to_all_v: count and displacement arrays must not be NULL");
  }
  check_usable();
  const size_t world = static_cast<size_t>(world_);
  if (config_.verify_counts) {
    // Every rank gathers every rank's (send, recv) counts and judges the whole matrix alike, so a
    // mismatch is refused on every rank with the same message before any payload moves.
    std::vector<uint64_t> mine(2 * world), all(2 * world * world);
    std::memcpy(mine.data(), send_counts, world * sizeof(uint64_t));
    std::memcpy(mine.data() + world, recv_counts, world * sizeof(uint64_t));
    call_host("all_to_all_v (count exchange)", [&](char* e, size_t n) {
      return services_->host_all_gather(services_->host_ctx, mine.data(), mine.size() * sizeof(uint64_t), all.data(),
                                        config_.timeout_ms, e, n);
    });
    for (size_t from = 0; from < world; ++from) {
      for (size_t to = 0; to < world; ++to) {
        const uint64_t sent = all[from * 2 * world + to], expected = all[to * 2 * world + world + from];
        if (sent != expected) {
          fail(CAD_STATUS_COMMUNICATION,
               format("all_to_all_v: rank %zu sends %llu bytes to rank %zu, which expects %llu", from,
                      static_cast<unsigned long long>(sent), to, static_cast<unsigned long long>(expected)));
        }
      }
    }
  }
  call_host("all_to_all_v", [&](char* e, size_t n) {
    return services_->host_all_to_all_v(services_->host_ctx, send, send_counts, send_displs, recv, recv_counts,
                                        recv_displs, config_.timeout_ms, e, n);
  });
}

void HostCommContext::all_gather(const void* send, uint64_t bytes, void* recv) {
  if (bytes > 0 && (send == nullptr || recv == nullptr)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "all_gather: send and recv must not be NULL");
  }
  check_usable();
  if (config_.verify_counts) {
    std::vector<uint64_t> sizes(static_cast<size_t>(world_));
    call_host("all_gather (size exchange)", [&](char* e, size_t n) {
      return services_->host_all_gather(services_->host_ctx, &bytes, sizeof bytes, sizes.data(), config_.timeout_ms,
                                        e, n);
    });
    for (size_t r = 1; r < sizes.size(); ++r) {  // judged against rank 0: the same message on every rank
      if (sizes[r] != sizes[0]) {
        fail(CAD_STATUS_COMMUNICATION, format("all_gather: rank %zu contributes %llu bytes, rank 0 %llu", r,
                                              static_cast<unsigned long long>(sizes[r]),
                                              static_cast<unsigned long long>(sizes[0])));
      }
    }
  }
  call_host("all_gather", [&](char* e, size_t n) {
    return services_->host_all_gather(services_->host_ctx, send, bytes, recv, config_.timeout_ms, e, n);
  });
}

void HostCommContext::barrier() {
  call_host("barrier", [&](char* e, size_t n) {
    return services_->host_barrier(services_->host_ctx, config_.timeout_ms, e, n);
  });
}

}  // namespace cad::host_comm

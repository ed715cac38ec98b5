// comm.cpp -- see comm.h.
#include "comm.h"

#include <cstring>

#include "plugin_support.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

Comm::Comm(const cad_communicator_v1_t* table, void* instance, std::string name)
    : table_(table), instance_(instance), name_(std::move(name)) {
  const size_t needed = offsetof(cad_communicator_v1_t, barrier) + sizeof(table->barrier);
  if (table_->struct_size < needed || table_->get_rank == nullptr || table_->get_world_size == nullptr ||
      table_->get_device == nullptr || table_->all_to_all_v == nullptr || table_->all_gather == nullptr) {
    fail(CAD_STATUS_ABI_MISMATCH, "communicator instance '" + name_ + "': its table lacks functions CAD needs");
  }
  if (table_->get_rank(instance_, &rank_) != CAD_STATUS_OK) failed("get_rank", CAD_STATUS_COMMUNICATION);
  if (table_->get_world_size(instance_, &world_) != CAD_STATUS_OK) failed("get_world_size", CAD_STATUS_COMMUNICATION);
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    fail(CAD_STATUS_COMMUNICATION, format("communicator instance '%s': rank %d of world %d is not valid",
                                          name_.c_str(), rank_, world_));
  }
  identified_ = true;
  if (table_->get_device(instance_, &device_) != CAD_STATUS_OK) failed("get_device", CAD_STATUS_COMMUNICATION);
}

void Comm::failed(const char* operation, cad_status_t status) const {
  const char* message = table_->last_error != nullptr ? table_->last_error(instance_) : nullptr;
  fail(status == CAD_STATUS_OK ? CAD_STATUS_COMMUNICATION : status,
       format("communicator instance '%s'%s: %s failed: %s", name_.c_str(),
              identified_ ? format(" (rank %d of %d)", rank_, world_).c_str() : "", operation,
              message != nullptr && message[0] != '\0' ? message : "(no message)"));
}

void Comm::all_gather(const void* send, uint64_t bytes, void* recv) {
  if (device_.device_type == CAD_DEVICE_CPU) {
    raw_all_gather(send, bytes, recv, nullptr);
    return;
  }
  if (!staging_) staging_.reset(make_host_gather_staging(device_.device_id));
  staged_all_gather(*staging_, *this, send, bytes, recv);
}

void Comm::raw_all_gather(const void* send, uint64_t bytes, void* recv, void* stream) {
  const cad_status_t status = table_->all_gather(instance_, send, bytes, recv, stream);
  if (status != CAD_STATUS_OK) failed("all_gather", status);
}

void Comm::all_to_all_v(const std::byte* send, const Transfer& t, std::byte* recv, void* stream) {
  const cad_status_t status = table_->all_to_all_v(instance_, send, t.send_counts.data(), t.send_displs.data(), recv,
                                                   t.recv_counts.data(), t.recv_displs.data(), stream);
  if (status != CAD_STATUS_OK) failed("all_to_all_v", status);
}

namespace {
struct Verdict {
  int32_t status;
  char message[252];
};
}  // namespace

void agree(Comm& comm, cad_status_t status, const std::string& message, const char* what) {
  Verdict mine{};
  mine.status = status;
  plugin::copy_message(message, mine.message, sizeof(mine.message));
  const std::vector<Verdict> all = comm.all_gather_value(mine);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].status != CAD_STATUS_OK) {
      Verdict v = all[rank];
      v.message[sizeof(v.message) - 1] = '\0';
      fail(v.status, format("%s on rank %zu: %s", what, rank, v.message));
    }
  }
}

}  // namespace cad::cad_plugin

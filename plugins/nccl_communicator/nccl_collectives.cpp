// nccl_collectives.cpp -- all_to_all_v as grouped ncclSend/ncclRecv (bytes as ncclUint8, messages
// split into chunk_bytes pieces, which NCCL keeps in order per peer), all_gather as ncclAllGather,
// barrier as a one-word ncclAllReduce.
#include "nccl_collectives.h"

#include <algorithm>
#include <vector>

#include "nccl_errors.h"

namespace cad::nccl_comm {

using plugin::fail;
using plugin::format;

namespace {

// verify_counts: every rank all-gathers (send_counts, recv_counts), so every rank sees every pair
// and refuses a mismatch with the same message. Waits for the stream; a peer that never joins is
// caught by the watchdog, whose abort lets the wait return.
void verify_counts(NcclContext& ctx, const uint64_t* send_counts, const uint64_t* recv_counts, cudaStream_t stream) {
  const size_t w = static_cast<size_t>(ctx.world_size());
  std::vector<uint64_t> mine(send_counts, send_counts + w), all(2 * w * w);
  mine.insert(mine.end(), recv_counts, recv_counts + w);
  uint64_t* table = ctx.count_table();
  uint64_t* my_row = table + 2 * w * w;
  check_cuda(cudaMemcpyAsync(my_row, mine.data(), 2 * w * sizeof(uint64_t), cudaMemcpyHostToDevice, stream),
             "all_to_all_v: copying the counts to the device");
  ctx.comm().launch("all_to_all_v (byte-count check)", stream, [&](ncclComm_t comm) {
    return ncclAllGather(my_row, table, 2 * w, ncclUint64, comm, stream);
  });
  const cudaError_t copied =
      cudaMemcpyAsync(all.data(), table, all.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
  const cudaError_t synced = copied == cudaSuccess ? cudaStreamSynchronize(stream) : copied;
  ctx.comm().check_usable();  // a timeout or NCCL error found by the watchdog comes first
  check_cuda(synced, "all_to_all_v: waiting for the byte-count check");
  std::string detail;
  int mismatches = 0;
  for (size_t from = 0; from < w; ++from) {
    for (size_t to = 0; to < w; ++to) {
      const uint64_t sent = all[from * 2 * w + to], expected = all[to * 2 * w + w + from];
      if (sent == expected) continue;
      if (mismatches++ < 4) {
        detail += format("%srank %zu sends %llu bytes to rank %zu, which expects %llu", detail.empty() ? "" : "; ",
                         from, static_cast<unsigned long long>(sent), to, static_cast<unsigned long long>(expected));
      }
    }
  }
  if (mismatches > 0) {
    fail(CAD_STATUS_COMMUNICATION, format("all_to_all_v: byte counts disagree between ranks (%d mismatched pair(s)): "
                                          "%s; nothing was sent", mismatches, detail.c_str()));
  }
}

}  // namespace

void all_to_all_v(NcclContext& ctx, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                  void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, cudaStream_t stream) {
  const int world = ctx.world_size(), me = ctx.rank();
  plugin::check_byte_layout("send", send, send_counts, send_displs, world);
  plugin::check_byte_layout("recv", recv, recv_counts, recv_displs, world);
  ctx.comm().check_usable();
  if (ctx.config().verify_counts) verify_counts(ctx, send_counts, recv_counts, stream);
  if (send_counts[me] != recv_counts[me]) {
    fail(CAD_STATUS_COMMUNICATION,
         format("all_to_all_v: rank %d sends %llu bytes to itself but expects %llu", me,
                static_cast<unsigned long long>(send_counts[me]), static_cast<unsigned long long>(recv_counts[me])));
  }
  // The copy engines (config copy_engines), except under CUDA-graph capture: their round numbers live on the
  // host, and a replayed graph would repeat them (the captured calls are the same on every rank, so every rank
  // takes NCCL for them alike).
  if (ctx.copy_engine() != nullptr && !stream_capturing(stream, /*if_unknown=*/true)) {
    ctx.copy_engine()->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, stream);
    ctx.comm().watch_enqueued("all_to_all_v (copy engines)", stream);
    return;
  }
  const char* send_bytes = static_cast<const char*>(send);
  char* recv_bytes = static_cast<char*>(recv);
  const uint64_t chunk = ctx.config().chunk_bytes;
  // Self included: NCCL copies the message to self inside the same kernel as the others, so it
  // overlaps with them (a separate cudaMemcpyAsync after the group would serialise behind it).
  ctx.comm().launch("all_to_all_v", stream, [&](ncclComm_t comm) -> ncclResult_t {
    for (int p = 0; p < world; ++p) {
      for (uint64_t done = 0; done < send_counts[p]; done += chunk) {
        const size_t n = static_cast<size_t>(std::min(chunk, send_counts[p] - done));
        const ncclResult_t r = ncclSend(send_bytes + send_displs[p] + done, n, ncclUint8, p, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
      for (uint64_t done = 0; done < recv_counts[p]; done += chunk) {
        const size_t n = static_cast<size_t>(std::min(chunk, recv_counts[p] - done));
        const ncclResult_t r = ncclRecv(recv_bytes + recv_displs[p] + done, n, ncclUint8, p, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
    }
    return ncclSuccess;
  });
}

void all_gather(NcclContext& ctx, const void* send, uint64_t bytes, void* recv, cudaStream_t stream) {
  if (bytes > 0 && (send == nullptr || recv == nullptr)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "all_gather: send or recv is NULL but bytes > 0");
  }
  ctx.comm().check_usable();
  if (bytes == 0) return;  // the same on every rank (bytes must agree), so nothing to enqueue anywhere
  ctx.comm().launch("all_gather", stream, [&](ncclComm_t comm) {
    return ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm, stream);
  });
}

void barrier(NcclContext& ctx, cudaStream_t stream) {
  ctx.comm().check_usable();
  int32_t* word = ctx.barrier_word();
  ctx.comm().launch("barrier", stream, [&](ncclComm_t comm) {
    return ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, stream);
  });
}

void connect_peers(NcclContext& ctx) {
  const int world = ctx.world_size();
  if (world < 2) return;
  DeviceScope scope(ctx.device());
  struct Resources {  // released on every way out
    cudaStream_t stream = nullptr;
    char* bytes = nullptr;  // world bytes to send, then world to receive
    ~Resources() {
      if (bytes != nullptr) cudaFree(bytes);
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  } r;
  const size_t w = static_cast<size_t>(world);
  check_cuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "connect_peers: cudaStreamCreate");
  check_cuda(cudaMalloc(&r.bytes, 2 * w), "connect_peers: cudaMalloc");
  std::vector<uint64_t> counts(w, 1), displs(w);
  for (size_t p = 0; p < w; ++p) displs[p] = p;
  check_cuda(cudaMemsetAsync(r.bytes, 0, 2 * w, r.stream), "connect_peers: cudaMemsetAsync");
  all_to_all_v(ctx, r.bytes, counts.data(), displs.data(), r.bytes + w, counts.data(), displs.data(), r.stream);
  const cudaError_t synced = cudaStreamSynchronize(r.stream);
  ctx.comm().check_usable();  // the watchdog's timeout or an NCCL error comes first
  check_cuda(synced, "connect_peers: waiting for the exchange");
}

}  // namespace cad::nccl_comm

// bench_all_to_all.cpp -- algorithm and bus bandwidth of a communicator plugin's all_to_all_v on
// CUDA buffers, driven through the plugin ABI alone. Run one process per GPU:
//
//   mpirun -np 4 build/bin/bench_nccl_all_to_all build/lib/cad/plugins/cad_nccl.so [--csv out.csv]
//                [--config JSON] [--label NAME] [--device D]
//
// A communicator on host memory (cad_mpi.so, whose get_device says CPU) is driven the way CAD's host-staged
// path drives it (plugins/cad/wire_device.cpp, StagedWire): each peer's bytes copied device -> pinned host,
// the stream synchronised, the host all_to_all_v, each peer's bytes copied host -> device. Its ranks run on
// GPU --device D (default: the local rank, OMPI_COMM_WORLD_LOCAL_RANK, modulo the GPUs), so several
// processes may share one GPU (--device 0), each standing for a GPU behind a host-bound link.
//
// For each total size S per rank (1 MiB .. 1 GiB) every rank sends S/world bytes to every rank
// (itself included), as torch.distributed.all_to_all_single does with equal splits. Timing: after a
// barrier, CUDA events around `iters` back-to-back calls on one stream; the reported time is rank 0's
// mean per call. algbw = S / time; busbw = algbw * (world-1) / world (the nccl-tests convention). After the
// timed calls every rank checks every received byte (peer p's range holds byte p) and fails otherwise.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cad_plugin_v1.h"

namespace {

void log_line(void*, cad_log_level_t, const char* source, const char* message) {
  std::fprintf(stderr, "[%s] %s\n", source, message);
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PLUGIN.so [--csv FILE] [--config JSON] [--label NAME] [--device D]\n", argv[0]);
    return 2;
  }
  std::string csv_path, config = "{}", label = "ours";
  int device_arg = -1;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--csv") == 0) csv_path = argv[i + 1];
    if (std::strcmp(argv[i], "--config") == 0) config = argv[i + 1];
    if (std::strcmp(argv[i], "--label") == 0) label = argv[i + 1];
    if (std::strcmp(argv[i], "--device") == 0) device_arg = std::atoi(argv[i + 1]);
  }
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  auto entry = reinterpret_cast<cad_plugin_entry_v1_fn>(dlsym(handle, CAD_PLUGIN_ENTRY_SYMBOL_V1));
  const cad_communicator_v1_t* comm = entry != nullptr ? entry()->communicator : nullptr;
  if (comm == nullptr) {
    std::fprintf(stderr, "%s is not a communicator plugin\n", argv[1]);
    return 1;
  }
  cad_host_services_v1_t services{};
  services.struct_size = sizeof(services);
  services.abi_major = CAD_ABI_VERSION_MAJOR;
  services.abi_minor = CAD_ABI_VERSION_MINOR;
  services.log_level = CAD_LOG_WARN;
  services.log = log_line;
  services.bootstrap_rank = -1;
  char message[1024] = {0};
  void* ctx = nullptr;
  if (comm->create(&services, config.c_str(), &ctx, message, sizeof(message)) != CAD_STATUS_OK) {
    std::fprintf(stderr, "create: %s\n", message);
    return 1;
  }
  int32_t rank = 0, world = 1;
  cad_device_v1_t device{};
  comm->get_rank(ctx, &rank);
  comm->get_world_size(ctx, &world);
  comm->get_device(ctx, &device);
  const bool staged = device.device_type != CAD_DEVICE_CUDA;
  int gpu = device.device_id;
  if (staged || device_arg >= 0) {
    int count = 0;
    if (!cuda_ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount") || count < 1) {
      comm->destroy(ctx);
      return 1;
    }
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    gpu = device_arg >= 0 ? device_arg : (local != nullptr ? std::atoi(local) : 0) % count;
  }
  if (!cuda_ok(cudaSetDevice(gpu), "cudaSetDevice")) {
    comm->destroy(ctx);
    return 1;
  }
  if (rank == 0 && staged) std::printf("host-staged through pinned memory, %d ranks, rank 0 on GPU %d\n", world, gpu);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);

  FILE* csv = (rank == 0 && !csv_path.empty()) ? std::fopen(csv_path.c_str(), "w") : nullptr;
  if (csv != nullptr) std::fprintf(csv, "impl,world,bytes_per_rank,seconds,algbw_GBps,busbw_GBps\n");
  if (rank == 0) std::printf("%-6s %14s %12s %12s %12s\n", "impl", "bytes/rank", "time_us", "algbw_GB/s", "busbw_GB/s");
  int status = 0;
  for (uint64_t total = 1ull << 20; total <= 1ull << 30 && status == 0; total *= 4) {
    const uint64_t per_peer = total / static_cast<uint64_t>(world);
    const uint64_t bytes = per_peer * static_cast<uint64_t>(world);
    void *send = nullptr, *recv = nullptr, *host_send = nullptr, *host_recv = nullptr;
    if (!cuda_ok(cudaMalloc(&send, bytes), "cudaMalloc") || !cuda_ok(cudaMalloc(&recv, bytes), "cudaMalloc")) return 1;
    if (staged && (!cuda_ok(cudaHostAlloc(&host_send, bytes, cudaHostAllocDefault), "cudaHostAlloc") ||
                   !cuda_ok(cudaHostAlloc(&host_recv, bytes, cudaHostAllocDefault), "cudaHostAlloc"))) {
      return 1;
    }
    cudaMemset(send, rank, bytes);
    cudaMemset(recv, 0xff, bytes);
    std::vector<uint64_t> counts(static_cast<size_t>(world), per_peer), displs(static_cast<size_t>(world));
    for (int p = 0; p < world; ++p) displs[static_cast<size_t>(p)] = per_peer * static_cast<uint64_t>(p);
    const int warmup = 5, iters = total >= (256ull << 20) ? 10 : 30;
    // Staged: one copy per peer each way, as StagedWire makes them (its ranges are not contiguous in general).
    auto staged_once = [&]() -> int {
      for (int p = 0; p < world; ++p) {
        cudaMemcpyAsync(static_cast<char*>(host_send) + displs[p], static_cast<const char*>(send) + displs[p], counts[p],
                        cudaMemcpyDeviceToHost, stream);
      }
      if (!cuda_ok(cudaStreamSynchronize(stream), "staging D2H")) return CAD_STATUS_INTERNAL;
      const int s = comm->all_to_all_v(ctx, host_send, counts.data(), displs.data(), host_recv, counts.data(),
                                       displs.data(), nullptr);
      if (s != CAD_STATUS_OK) return s;
      for (int p = 0; p < world; ++p) {
        cudaMemcpyAsync(static_cast<char*>(recv) + displs[p], static_cast<const char*>(host_recv) + displs[p], counts[p],
                        cudaMemcpyHostToDevice, stream);
      }
      return CAD_STATUS_OK;
    };
    auto once = [&] {
      if (staged) return staged_once();
      return comm->all_to_all_v(ctx, send, counts.data(), displs.data(), recv, counts.data(), displs.data(), stream);
    };
    for (int i = 0; i < warmup && status == 0; ++i) status = once();
    cudaStreamSynchronize(stream);
    status = status ? status : comm->barrier(ctx, staged ? nullptr : stream);
    cudaStreamSynchronize(stream);
    cudaEventRecord(start, stream);
    for (int i = 0; i < iters && status == 0; ++i) status = once();
    cudaEventRecord(stop, stream);
    cudaStreamSynchronize(stream);
    if (status != 0) {
      std::fprintf(stderr, "rank %d: all_to_all_v failed: %s\n", rank, comm->last_error(ctx));
      break;
    }
    // Every received byte: peer p's range holds p (the send buffers' fill), so a wrong displacement or a
    // missing copy fails the run instead of timing it.
    std::vector<unsigned char> got(bytes);
    cudaMemcpy(got.data(), recv, bytes, cudaMemcpyDeviceToHost);
    for (int p = 0; p < world && status == 0; ++p) {
      for (uint64_t i = 0; i < per_peer; ++i) {
        if (got[displs[p] + i] != static_cast<unsigned char>(p)) {
          std::fprintf(stderr, "rank %d: byte %llu from rank %d is %d, expected %d (%llu bytes per rank)\n", rank,
                       static_cast<unsigned long long>(i), p, got[displs[p] + i], p, static_cast<unsigned long long>(bytes));
          status = CAD_STATUS_INTERNAL;
          break;
        }
      }
    }
    if (status != 0) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    const double seconds = ms / 1e3 / iters;
    const double algbw = static_cast<double>(bytes) / seconds / 1e9;
    const double busbw = algbw * (world - 1) / world;
    if (rank == 0) {
      std::printf("%-6s %14llu %12.1f %12.2f %12.2f\n", label.c_str(), static_cast<unsigned long long>(bytes), seconds * 1e6,
                  algbw, busbw);
      if (csv != nullptr) {
        std::fprintf(csv, "%s,%d,%llu,%.9f,%.3f,%.3f\n", label.c_str(), world, static_cast<unsigned long long>(bytes), seconds,
                     algbw, busbw);
        std::fflush(csv);  // a run cut short by a time limit keeps the sizes it finished
      }
      std::fflush(stdout);
    }
    cudaFree(send);
    cudaFree(recv);
    if (staged) {
      cudaFreeHost(host_send);
      cudaFreeHost(host_recv);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  comm->destroy(ctx);
  return status == 0 ? 0 : 1;
}

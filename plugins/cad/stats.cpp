// stats.cpp -- see stats.h.
#include "stats.h"

#include <nlohmann/json.hpp>

#include "plugin_support.h"

namespace cad::cad_plugin {

std::vector<ServerWork> server_work(const Layout& layout, const CallShape& shape) {
  std::vector<ServerWork> work(layout.servers.size());
  for (size_t s = 0; s < layout.servers.size(); ++s) {
    const ServerBatch& batch = layout.servers[s];
    ServerWork& w = work[s];
    w.q_rows = batch.q_rows;
    w.kv_rows = batch.kv_rows;
    w.segments = static_cast<int64_t>(batch.segments.size());
    for (const cad_segment_v1_t& seg : batch.segments) {
      const double q = static_cast<double>(seg.q_len), kv = static_cast<double>(seg.kv_len);
      // Causal, bottom-right: query i sees kv - q + i + 1 keys.
      w.score_entries += shape.causal ? q * kv - q * (q - 1.0) / 2.0 : q * kv;
    }
    w.forward_flops = 4.0 * shape.head_dim * shape.num_q_heads * w.score_entries;
  }
  return work;
}

void gather_bytes(Comm& comm, CallStats& call) {
  struct Bytes {
    uint64_t sent, received;
  };
  const std::vector<Bytes> all = comm.all_gather_value(Bytes{call.bytes_sent, call.bytes_received});
  call.bytes_sent_by_rank.clear();
  call.bytes_received_by_rank.clear();
  for (const Bytes& b : all) {
    call.bytes_sent_by_rank.push_back(b.sent);
    call.bytes_received_by_rank.push_back(b.received);
  }
}

namespace {

nlohmann::json call_json(const CallStats& c) {
  nlohmann::json servers = nlohmann::json::array();
  for (size_t s = 0; s < c.servers.size(); ++s) {
    const ServerWork& w = c.servers[s];
    servers.push_back({{"server", s},
                       {"q_rows", w.q_rows},
                       {"kv_rows", w.kv_rows},
                       {"segments", w.segments},
                       {"score_entries", w.score_entries},
                       {"forward_flops", w.forward_flops}});
  }
  return {{"replanned", c.replanned},
          {"plan_ms", c.plan_ms},
          {"pack_ms", c.pack_ms},
          {"exchange_ms", c.exchange_ms},
          {"compute_ms", c.compute_ms},
          {"unpack_ms", c.unpack_ms},
          {"total_ms", c.total_ms},
          {"bytes_sent", c.bytes_sent},
          {"bytes_received", c.bytes_received},
          {"bytes_sent_by_rank", c.bytes_sent_by_rank},
          {"bytes_received_by_rank", c.bytes_received_by_rank},
          {"servers", servers}};
}

}  // namespace

std::string stats_json(const Stats& stats) {
  nlohmann::json j = {{"rank", stats.rank}, {"world", stats.world}};
  if (stats.forward.valid) j["forward"] = call_json(stats.forward);
  if (stats.backward.valid) j["backward"] = call_json(stats.backward);
  return j.dump();
}

std::string stats_line(const char* phase, const CallStats& c, int32_t rank) {
  double max_entries = 0.0, sum_entries = 0.0;
  for (const ServerWork& w : c.servers) {
    max_entries = std::max(max_entries, w.score_entries);
    sum_entries += w.score_entries;
  }
  const double mean = c.servers.empty() ? 0.0 : sum_entries / static_cast<double>(c.servers.size());
  return plugin::format("%s rank %d: plan %.3f ms, pack %.3f ms, exchange %.3f ms, compute %.3f ms, unpack %.3f ms, "
                        "total %.3f ms; sent %llu B, received %llu B; server work max/mean %.3f",
                        phase, rank, c.plan_ms, c.pack_ms, c.exchange_ms, c.compute_ms, c.unpack_ms, c.total_ms,
                        static_cast<unsigned long long>(c.bytes_sent), static_cast<unsigned long long>(c.bytes_received),
                        mean > 0.0 ? max_entries / mean : 1.0);
}

}  // namespace cad::cad_plugin

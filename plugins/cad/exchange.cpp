// exchange.cpp -- see exchange.h.
#include "exchange.h"

#include <cstring>

namespace cad::cad_plugin {
namespace {

// The run list that moves `set` between this rank and `peer`, and which end of each run is this
// rank's row. A sender to the servers is the owner; a receiver from the owners is the server.
struct PeerRuns {
  const std::vector<RowRun>* runs;
  bool mine_is_src;  // true: this rank's row is run.src_row (it is the owner)
};

PeerRuns peer_runs(const Layout& layout, int32_t me, int32_t peer, Direction direction, RunSet set, bool sending) {
  const bool i_am_owner = (direction == Direction::ToServers) == sending;
  const Route& route = i_am_owner ? layout.route(me, peer) : layout.route(peer, me);
  return PeerRuns{set == RunSet::Q ? &route.q : &route.kv, i_am_owner};
}

int64_t peer_rows(const Layout& layout, int32_t me, int32_t peer, Direction direction, RunSet set, bool sending) {
  const bool i_am_owner = (direction == Direction::ToServers) == sending;
  const Route& route = i_am_owner ? layout.route(me, peer) : layout.route(peer, me);
  return set == RunSet::Q ? route.q_rows : route.kv_rows;
}

uint64_t peer_bytes(const Layout& layout, int32_t me, int32_t peer, Direction direction,
                    const std::vector<Part>& parts, bool sending) {
  uint64_t bytes = 0;
  for (const Part& part : parts) {
    bytes += static_cast<uint64_t>(peer_rows(layout, me, peer, direction, part.runs, sending) * part.row_bytes);
  }
  return bytes;
}

void accumulate_row(float* dst, const std::byte* src, int64_t row_bytes, bool wire_bf16) {
  if (wire_bf16) {
    const int64_t n = row_bytes / 2;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * i, 2);
      dst[i] += bf16_to_float(bits);
    }
  } else {
    const int64_t n = row_bytes / 4;
    for (int64_t i = 0; i < n; ++i) {
      float value;
      std::memcpy(&value, src + 4 * i, 4);
      dst[i] += value;
    }
  }
}

}  // namespace

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

Transfer plan_transfer(const Layout& layout, int32_t me, Direction direction, const std::vector<Part>& send,
                       const std::vector<Part>& recv) {
  const size_t world = static_cast<size_t>(layout.world);
  Transfer t;
  t.send_counts.resize(world);
  t.send_displs.resize(world);
  t.recv_counts.resize(world);
  t.recv_displs.resize(world);
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    const size_t p = static_cast<size_t>(peer);
    t.send_counts[p] = peer_bytes(layout, me, peer, direction, send, true);
    t.recv_counts[p] = peer_bytes(layout, me, peer, direction, recv, false);
    t.send_displs[p] = t.send_bytes;
    t.recv_displs[p] = t.recv_bytes;
    t.send_bytes += t.send_counts[p];
    t.recv_bytes += t.recv_counts[p];
  }
  return t;
}

void pack(const Layout& layout, int32_t me, Direction direction, const std::vector<Part>& send,
          const Transfer& transfer, std::byte* buffer) {
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    std::byte* out = buffer + transfer.send_displs[static_cast<size_t>(peer)];
    for (const Part& part : send) {
      const PeerRuns pr = peer_runs(layout, me, peer, direction, part.runs, true);
      for (const RowRun& run : *pr.runs) {
        const int64_t first = pr.mine_is_src ? run.src_row : run.dst_row;
        if (part.format == Format::LseColumns) {
          const float* lse = reinterpret_cast<const float*>(part.data);
          for (int64_t row = first; row < first + run.count; ++row) {
            for (int64_t h = 0; h < part.lse_heads; ++h) {
              const float value = lse[h * part.lse_rows + row];
              std::memcpy(out, &value, 4);
              out += 4;
            }
          }
        } else {
          const size_t bytes = static_cast<size_t>(run.count * part.row_bytes);
          std::memcpy(out, part.data + first * part.row_bytes, bytes);
          out += bytes;
        }
      }
    }
  }
}

void unpack(const Layout& layout, int32_t me, Direction direction, const std::vector<Part>& recv,
            const Transfer& transfer, const std::byte* buffer) {
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    const std::byte* in = buffer + transfer.recv_displs[static_cast<size_t>(peer)];
    for (const Part& part : recv) {
      const PeerRuns pr = peer_runs(layout, me, peer, direction, part.runs, false);
      for (const RowRun& run : *pr.runs) {
        const int64_t first = pr.mine_is_src ? run.src_row : run.dst_row;
        switch (part.format) {
          case Format::Rows: {
            const size_t bytes = static_cast<size_t>(run.count * part.row_bytes);
            std::memcpy(part.data + first * part.row_bytes, in, bytes);
            in += bytes;
            break;
          }
          case Format::LseColumns: {
            float* lse = reinterpret_cast<float*>(part.data);
            for (int64_t row = first; row < first + run.count; ++row) {
              for (int64_t h = 0; h < part.lse_heads; ++h) {
                std::memcpy(&lse[h * part.lse_rows + row], in, 4);
                in += 4;
              }
            }
            break;
          }
          case Format::AccumulateRows: {
            const int64_t elements = part.row_bytes / (part.wire_bf16 ? 2 : 4);
            float* dst = reinterpret_cast<float*>(part.data);
            for (int64_t row = first; row < first + run.count; ++row) {
              accumulate_row(dst + row * elements, in, part.row_bytes, part.wire_bf16);
              in += part.row_bytes;
            }
            break;
          }
        }
      }
    }
  }
}

}  // namespace cad::cad_plugin

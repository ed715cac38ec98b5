// schedule.cpp -- see schedule.h.
#include "schedule.h"

namespace cad::cad_plugin {

void pipeline_head_groups(Mover& move, int64_t groups, const std::function<std::vector<Mover::Slice>(int64_t)>& inbound,
                          const std::function<void()>& own, const std::function<void(int64_t)>& compute,
                          const std::function<void()>& computed,
                          const std::function<void(int64_t, std::vector<Mover::InFlight>&)>& send_back) {
  std::vector<Mover::InFlight> in, out;
  for (int64_t g = 0; g < groups; ++g) in.push_back(move.start(Direction::ToServers, inbound(g)));
  own();
  for (int64_t g = 0; g < groups; ++g) {
    move.finish(in[static_cast<size_t>(g)]);
    compute(g);
    if (g == groups - 1) computed();
    send_back(g, out);
  }
  for (Mover::InFlight& f : out) move.finish(f);
}

}  // namespace cad::cad_plugin

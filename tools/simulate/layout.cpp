// layout.cpp -- checks of a parallel layout against a model shape.
#include "layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace cad::simulate {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

void validate(const Layout& l, const ModelShape& s) {
  if (l.gpus < 1) throw std::invalid_argument("--gpus must be >= 1, got " + str(l.gpus));
  if (l.gpus_per_node < 1) throw std::invalid_argument("--gpus-per-node must be >= 1, got " + str(l.gpus_per_node));
  if (l.tp < 1) throw std::invalid_argument("--tp must be >= 1, got " + str(l.tp));
  if (l.pp < 1) throw std::invalid_argument("--pp must be >= 1, got " + str(l.pp));
  // tp * pp could wrap (--tp 2^32 --pp 2^32 is 0 in int64: SIGFPE below), so each must first fit in gpus.
  if (l.tp > l.gpus || l.pp > l.gpus || l.tp > l.gpus / l.pp) {
    throw std::invalid_argument("--tp " + str(l.tp) + " x --pp " + str(l.pp) + " is more than --gpus " + str(l.gpus));
  }
  if (l.gpus % (l.tp * l.pp) != 0) {
    throw std::invalid_argument("--gpus " + str(l.gpus) + " is not a multiple of --tp x --pp = " + str(l.tp * l.pp) +
                                " (data-parallel ranks must be whole)");
  }
  if (l.tp > l.gpus_per_node || l.gpus_per_node % l.tp != 0) {
    throw std::invalid_argument("--tp " + str(l.tp) + " must divide --gpus-per-node " + str(l.gpus_per_node) +
                                " (a tensor-parallel group stays inside one node)");
  }
  if (s.heads % l.tp != 0) {
    throw std::invalid_argument("--tp " + str(l.tp) + " does not divide the model's heads (" + str(s.heads) + ")");
  }
  if (s.kv_heads % l.tp != 0 && l.tp % s.kv_heads != 0) {
    throw std::invalid_argument("--tp " + str(l.tp) + " and the model's kv_heads (" + str(s.kv_heads) +
                                ") must divide one another");
  }
  if (s.layers % l.pp != 0) {
    throw std::invalid_argument("--pp " + str(l.pp) + " does not divide the model's layers (" + str(s.layers) + ")");
  }
}

int64_t heads_per_gpu(const Layout& l, const ModelShape& s) { return s.heads / l.tp; }

int64_t kv_heads_per_gpu(const Layout& l, const ModelShape& s) { return std::max<int64_t>(1, s.kv_heads / l.tp); }

}  // namespace cad::simulate

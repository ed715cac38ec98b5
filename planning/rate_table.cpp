// rate_table.cpp -- see rate_table.h.
#include "rate_table.h"

#include "tile_pairs.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "bounded_file.h"

namespace cad::plan {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& name, const std::string& key, const std::string& what) {
  throw std::invalid_argument(name + ": key '" + key + "' " + what);
}

const json& member(const json& obj, const char* key, const std::string& name, const std::string& where) {
  const std::string full = where.empty() ? key : where + "." + key;
  if (!obj.is_object() || !obj.contains(key)) bad(name, full, "is missing");
  return obj.at(key);
}

double positive_number(const json& v, const std::string& name, const std::string& key) {
  if (!v.is_number()) bad(name, key, "must be a number");
  const double d = v.get<double>();
  if (!(d > 0) || !std::isfinite(d)) bad(name, key, "must be a finite number > 0, got " + v.dump());
  return d;
}

int64_t positive_integer(const json& v, const std::string& name, const std::string& key) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1) bad(name, key, "must be an integer >= 1, got " + v.dump());
  return v.get<int64_t>();
}

std::string text(const json& v, const std::string& name, const std::string& key) {
  if (!v.is_string() || v.get<std::string>().empty()) bad(name, key, "must be a non-empty string");
  return v.get<std::string>();
}

Rate read_rate(const json& obj, const char* key, const std::string& name, const std::string& where) {
  const std::string full = where + "." + key;
  const json r = member(obj, key, name, where);
  if (!r.is_object()) bad(name, full, "must be an object {\"tflops\": ..., \"source\": ...}");
  Rate rate;
  rate.tflops = positive_number(member(r, "tflops", name, full), name, full + ".tflops");
  rate.source = text(member(r, "source", name, full), name, full + ".source");
  return rate;
}

std::vector<int64_t> read_axis(const json& doc, const char* key, const std::string& name) {
  const json a = member(doc, key, name, "");  // a copy: gcc 13 flags a reference bound through a temporary argument
  if (!a.is_array() || a.empty()) bad(name, key, "must be a non-empty array of integers");
  std::vector<int64_t> axis;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string k = std::string(key) + "[" + std::to_string(i) + "]";
    axis.push_back(positive_integer(a[i], name, k));
    if (i > 0 && axis[i] <= axis[i - 1]) bad(name, k, "must be larger than the entry before it (strictly increasing)");
  }
  return axis;
}

// Where x falls on a log-scaled axis (logs precomputed): cell index i and weight t of axis[i + 1]
// (clamped to the ends).
RateTable::AxisPoint locate(const std::vector<int64_t>& axis, const std::vector<double>& log_axis, int64_t x) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0.0};
  if (x >= axis.back()) return {axis.size() - 2, 1.0};
  const size_t hi = static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  const size_t lo = hi - 1;
  return {lo, (std::log(static_cast<double>(x)) - log_axis[lo]) / (log_axis[hi] - log_axis[lo])};
}

// The four grid cells around (q, kv) and the weights of the upper ones.
struct Cell {
  size_t c00, c01, c10, c11;
  double tq, tk;
};

Cell cell_of(const RateTable& t, RateTable::AxisPoint q, RateTable::AxisPoint kv) {
  const size_t nk = t.kv_lens.size();
  const size_t qi1 = std::min(q.index + 1, t.q_lens.size() - 1);
  const size_t ki1 = std::min(kv.index + 1, nk - 1);
  return {q.index * nk + kv.index, q.index * nk + ki1, qi1 * nk + kv.index, qi1 * nk + ki1, q.weight, kv.weight};
}

Cell cell_at(const RateTable& t, int64_t q, int64_t kv) { return cell_of(t, t.locate_q(q), t.locate_kv(kv)); }

// Bilinear interpolation of the rates at a cell.
double mix(const Cell& c, const std::vector<Rate>& r) {
  return (1 - c.tq) * ((1 - c.tk) * r[c.c00].tflops + c.tk * r[c.c01].tflops) +
         c.tq * ((1 - c.tk) * r[c.c10].tflops + c.tk * r[c.c11].tflops);
}

std::vector<double> logs_of(const std::vector<int64_t>& axis) {
  std::vector<double> out;
  for (int64_t x : axis) out.push_back(std::log(static_cast<double>(x)));
  return out;
}

// The optional "backward_tiles" key; also fills dense_entries_per_us (needs head_dim and dense_time).
void read_backward_tiles(const json& v, const std::string& name, RateTable& t) {
  const std::string key = "backward_tiles";
  if (!v.is_object()) {
    bad(name, key, "must be an object {\"block_m\", \"block_n\", \"full_pair_us\", \"partial_pair_us\", \"source\"}");
  }
  BackwardTiles& b = t.backward_tiles;
  b.block_m = positive_integer(member(v, "block_m", name, key), name, key + ".block_m");
  b.block_n = positive_integer(member(v, "block_n", name, key), name, key + ".block_n");
  if (b.block_n % b.block_m != 0) {
    bad(name, key + ".block_n", "= " + std::to_string(b.block_n) + " must be a multiple of block_m = " +
                                    std::to_string(b.block_m) + " (the closed-form pair count assumes it)");
  }
  b.full_pair_us = positive_number(member(v, "full_pair_us", name, key), name, key + ".full_pair_us");
  b.partial_pair_us = positive_number(member(v, "partial_pair_us", name, key), name, key + ".partial_pair_us");
  b.source = text(member(v, "source", name, key), name, key + ".source");
  t.has_backward_tiles = true;
  // One head's score entry at the dense rate takes 4 * head_dim FLOPs x dense_time (s per TFLOP) x 1e-12.
  t.dense_entries_per_us = 1e-6 / (4.0 * static_cast<double>(t.head_dim) * t.dense_time * 1e-12);
}

// Microseconds of one query head's backward over a shard's tile pairs ("backward_tiles").
double backward_pair_us(const BackwardTiles& b, int64_t q, int64_t kv, bool causal) {
  const TilePairs p = backward_tile_pairs(q, kv, causal, b.block_m, b.block_n);
  return b.full_pair_us * static_cast<double>(p.full) + b.partial_pair_us * static_cast<double>(p.partial);
}

}  // namespace

double RateTable::fwd_tflops(int64_t q, int64_t kv) const { return mix(cell_at(*this, q, kv), fwd); }
double RateTable::bwd_tflops(int64_t q, int64_t kv) const { return mix(cell_at(*this, q, kv), bwd); }

double RateTable::bwd_seconds(int64_t q, int64_t kv, bool causal, double fwd_flops, int64_t q_heads) const {
  if (!has_backward_tiles) return backward_flop_ratio * fwd_flops / (bwd_tflops(q, kv) * 1e12);
  return static_cast<double>(q_heads) * backward_pair_us(backward_tiles, q, kv, causal) * 1e-6;
}

double RateTable::shard_seconds(int64_t q, int64_t kv, bool causal, double fwd_flops, int64_t q_heads) const {
  return fwd_flops / (fwd_tflops(q, kv) * 1e12) + bwd_seconds(q, kv, causal, fwd_flops, q_heads);
}

double RateTable::weighted_entries_at(int64_t entries, int64_t q, int64_t kv, bool causal, AxisPoint q_at,
                                      AxisPoint kv_at) const {
  if (!has_backward_tiles) return static_cast<double>(entries) * relative_time_at(q_at, kv_at);
  const double pair_us = backward_pair_us(backward_tiles, q, kv, causal);
  const double fwd_relative = 1.0 / mix(cell_of(*this, q_at, kv_at), fwd) / dense_time;
  return static_cast<double>(entries) * fwd_relative + pair_us * dense_entries_per_us;
}

int64_t RateTable::shortest_priced_shard() const {
  const int64_t grid = q_lens.empty() ? 1 : q_lens.front();
  return has_backward_tiles ? std::max(grid, backward_tiles.block_m) : grid;
}

RateTable::AxisPoint RateTable::locate_q(int64_t q) const { return locate(q_lens, log_q_lens, q); }
RateTable::AxisPoint RateTable::locate_kv(int64_t kv) const { return locate(kv_lens, log_kv_lens, kv); }

double RateTable::relative_time_at(AxisPoint q, AxisPoint kv) const {
  const Cell c = cell_of(*this, q, kv);
  return (1.0 / mix(c, fwd) + backward_flop_ratio / mix(c, bwd)) / dense_time;
}

double RateTable::relative_time(int64_t q, int64_t kv) const { return relative_time_at(locate_q(q), locate_kv(kv)); }

RateTable parse_rate_table(const std::string& json_text, const std::string& name) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(name + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) throw std::invalid_argument(name + ": the top level must be a JSON object");
  RateTable t;
  t.gpu = text(member(doc, "gpu", name, ""), name, "gpu");
  t.head_dim = static_cast<int32_t>(positive_integer(member(doc, "head_dim", name, ""), name, "head_dim"));
  t.backward_flop_ratio = positive_number(member(doc, "backward_flop_ratio", name, ""), name, "backward_flop_ratio");
  const json dense = member(doc, "dense", name, "");
  t.dense_len = positive_integer(member(dense, "len", name, "dense"), name, "dense.len");
  t.dense_fwd = read_rate(dense, "fwd", name, "dense");
  t.dense_bwd = read_rate(dense, "bwd", name, "dense");
  t.dense_time = 1.0 / t.dense_fwd.tflops + t.backward_flop_ratio / t.dense_bwd.tflops;
  t.q_lens = read_axis(doc, "q_lens", name);
  t.kv_lens = read_axis(doc, "kv_lens", name);
  t.log_q_lens = logs_of(t.q_lens);
  t.log_kv_lens = logs_of(t.kv_lens);

  const json grid = member(doc, "grid", name, "");
  if (!grid.is_array()) bad(name, "grid", "must be an array of {q, kv, fwd, bwd} entries");
  const size_t nq = t.q_lens.size(), nk = t.kv_lens.size();
  std::map<std::pair<int64_t, int64_t>, size_t> seen;  // (q, kv) -> entry index
  t.fwd.assign(nq * nk, Rate{});
  t.bwd.assign(nq * nk, Rate{});
  for (size_t i = 0; i < grid.size(); ++i) {
    const std::string where = "grid[" + std::to_string(i) + "]";
    const int64_t q = positive_integer(member(grid[i], "q", name, where), name, where + ".q");
    const int64_t kv = positive_integer(member(grid[i], "kv", name, where), name, where + ".kv");
    const auto qit = std::find(t.q_lens.begin(), t.q_lens.end(), q);
    const auto kit = std::find(t.kv_lens.begin(), t.kv_lens.end(), kv);
    if (qit == t.q_lens.end()) bad(name, where + ".q", "= " + std::to_string(q) + " is not one of q_lens");
    if (kit == t.kv_lens.end()) bad(name, where + ".kv", "= " + std::to_string(kv) + " is not one of kv_lens");
    if (!seen.emplace(std::make_pair(q, kv), i).second) {
      bad(name, where, "repeats (q, kv) = (" + std::to_string(q) + ", " + std::to_string(kv) + ") of grid[" +
                           std::to_string(seen[{q, kv}]) + "]");
    }
    const size_t cell = static_cast<size_t>(qit - t.q_lens.begin()) * nk + static_cast<size_t>(kit - t.kv_lens.begin());
    t.fwd[cell] = read_rate(grid[i], "fwd", name, where);
    t.bwd[cell] = read_rate(grid[i], "bwd", name, where);
  }
  for (size_t qi = 0; qi < nq; ++qi) {
    for (size_t ki = 0; ki < nk; ++ki) {
      if (t.fwd[qi * nk + ki].tflops == 0) {
        bad(name, "grid", "has no entry for (q, kv) = (" + std::to_string(t.q_lens[qi]) + ", " +
                              std::to_string(t.kv_lens[ki]) + "); every pair of q_lens x kv_lens needs one");
      }
    }
  }
  if (doc.contains("backward_tiles")) read_backward_tiles(doc.at("backward_tiles"), name, t);
  return t;
}

RateTable load_rate_table(const std::string& path) {
  // A regular file of at most 16 MiB (bounded_file.h): a FIFO or /dev/zero is refused, not read.
  std::string text, error;
  if (files::read_regular_file(path, files::kMaxJsonFileBytes, "rate table", &text, &error) != files::ReadStatus::kOk) {
    throw std::invalid_argument(error);
  }
  RateTable t = parse_rate_table(text, path);
  t.path = path;
  return t;
}

}  // namespace cad::plan

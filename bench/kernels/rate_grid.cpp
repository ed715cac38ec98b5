// rate_grid.cpp -- see rate_grid.h.
#include "rate_grid.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "plan_model.h"

namespace cad::rates {

namespace {

// Queries per forward work unit of the Hopper kernel at D 128 (fwd_block_m90 in kernels/cad_kernels.h; 192 at
// D 64). It only sizes a batch to fill the GPU, so the D 128 tile serves both head dims.
constexpr int64_t kFwdTileRows = 128;

void check_axis(const std::vector<int64_t>& axis, const char* name) {
  if (axis.empty()) throw std::invalid_argument(std::string(name) + ": needs at least one length");
  for (size_t i = 0; i < axis.size(); ++i) {
    if (axis[i] < 1) {
      throw std::invalid_argument(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(axis[i]) +
                                  ": lengths must be >= 1");
    }
    if (i > 0 && axis[i] <= axis[i - 1]) {
      throw std::invalid_argument(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(axis[i]) +
                                  ": lengths must be strictly increasing");
    }
  }
}

// "%.4g" of a double, for ms in sources and messages.
std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

// The rate as the table stores it: 0.1 TFLOP/s is far below the run-to-run noise.
double rounded(double tflops) { return std::round(tflops * 10.0) / 10.0; }

// What a timed shape's rates say about where they come from.
std::string source_of(const Shape& s, const Measurement& m, const GridSpec& spec, const TableInfo& info,
                      bool backward) {
  std::string src = "cad_measure_rate_table: " + std::to_string(m.n) + " shard" + (m.n == 1 ? "" : "s") + " of " +
                    std::to_string(s.q) + " queries on " + std::to_string(s.kv) + " keys each (tq " +
                    std::to_string(m.tq) + ", tk " + std::to_string(m.tk) + ", Hq " + std::to_string(spec.hq) +
                    " Hkv " + std::to_string(spec.hkv) + " D " + std::to_string(spec.head_dim) + " bf16), " +
                    (backward ? "bwd " + short_number(m.bwd_ms) : "fwd " + short_number(m.fwd_ms)) +
                    " ms, median of " + std::to_string(info.reps) + " after " + std::to_string(info.warmups) +
                    " warm-ups, " + info.date;
  if (!info.source_tag.empty()) src += ", " + info.source_tag;
  return src;
}

nlohmann::ordered_json rate_json(double tflops, const std::string& source) {
  nlohmann::ordered_json r;
  r["tflops"] = rounded(tflops);
  r["source"] = source;
  return r;
}

}  // namespace

void validate(const GridSpec& spec) {
  check_axis(spec.q_lens, "q_lens");
  check_axis(spec.kv_lens, "kv_lens");
  if (spec.hq < 1 || spec.hkv < 1 || spec.hq % spec.hkv != 0) {
    throw std::invalid_argument("heads: expected Hq % Hkv == 0 and both >= 1, got Hq " + std::to_string(spec.hq) +
                                ", Hkv " + std::to_string(spec.hkv));
  }
  if (spec.head_dim < 1) throw std::invalid_argument("head_dim must be >= 1, got " + std::to_string(spec.head_dim));
  if (!(spec.target_gflop > 0) || !std::isfinite(spec.target_gflop)) {
    throw std::invalid_argument("target_gflop must be a finite number > 0, got " + std::to_string(spec.target_gflop));
  }
  if (spec.max_q_rows < 1 || spec.max_kv_rows < 1) {
    throw std::invalid_argument("max_q_rows and max_kv_rows must be >= 1, got " + std::to_string(spec.max_q_rows) +
                                " and " + std::to_string(spec.max_kv_rows));
  }
  if (spec.min_units < 0) throw std::invalid_argument("min_units must be >= 0, got " + std::to_string(spec.min_units));
  if (spec.dense_len < 1) throw std::invalid_argument("dense_len must be >= 1, got " + std::to_string(spec.dense_len));
}

std::string to_string(const Shape& s) { return "(" + std::to_string(s.q) + ", " + std::to_string(s.kv) + ")"; }

double shard_forward_flops(const Shape& s, const GridSpec& spec) {
  cad::plan::ModelParams params;
  params.num_q_heads = spec.hq;
  params.num_kv_heads = spec.hkv;
  params.head_dim = spec.head_dim;
  params.causal = true;
  // The last q queries of a document of kv tokens.
  return cad::plan::entries_to_flops(cad::plan::task_cost(s.kv - s.q, s.kv, s.kv, true), params);
}

int64_t shards_for(const Shape& s, const GridSpec& spec) {
  const double per_shard = shard_forward_flops(s, spec);
  const double wanted = std::ceil(spec.target_gflop * 1e9 / per_shard);
  int64_t n = wanted < 1 ? 1 : static_cast<int64_t>(std::min(wanted, 1e15));
  const int64_t units_per_shard = (s.q + kFwdTileRows - 1) / kFwdTileRows * spec.hq;
  n = std::max(n, (spec.min_units + units_per_shard - 1) / units_per_shard);
  n = std::min({n, spec.max_q_rows / s.q, spec.max_kv_rows / s.kv});
  return std::max<int64_t>(n, 1);
}

ShardBatch make_batch(const Shape& s, int64_t n, const GridSpec& spec) {
  if (s.q < 1 || s.kv < s.q || n < 1) {
    throw std::invalid_argument("make_batch: expected 1 <= q <= kv and n >= 1, got shape " + to_string(s) +
                                ", n " + std::to_string(n));
  }
  ShardBatch b;
  b.shape = s;
  b.n = n;
  b.segments.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // Bottom-right causal: query j of the shard sees keys [0, kv - q + j], so the last one sees all kv.
    b.segments.push_back(cad_segment_v1_t{b.tq, s.q, b.tk, s.kv});
    b.tq += s.q;
    b.tk += s.kv;
  }
  b.forward_flops = static_cast<double>(n) * shard_forward_flops(s, spec);
  return b;
}

Shape timed_shape_of(const Shape& cell) { return cell.q > cell.kv ? Shape{cell.kv, cell.kv} : cell; }

std::vector<PlannedShape> shapes_to_time(const GridSpec& spec) {
  std::vector<PlannedShape> out;
  auto add = [&](const Shape& s, const char* role) {
    for (PlannedShape& p : out) {
      if (p.shape == s) {
        if (p.role.find(role) == std::string::npos) p.role += std::string("+") + role;
        return;
      }
    }
    out.push_back({s, role});
  };
  for (int64_t q : spec.q_lens) {
    for (int64_t kv : spec.kv_lens) {
      if (q <= kv) add({q, kv}, "grid");
    }
  }
  for (int64_t q : spec.q_lens) {
    for (int64_t kv : spec.kv_lens) {
      if (q > kv) add(timed_shape_of({q, kv}), "diagonal");
    }
  }
  add({spec.dense_len, spec.dense_len}, "dense");
  return out;
}

Measurement measurement_of(const ShardBatch& b, double fwd_ms, double bwd_ms) {
  Measurement m;
  m.n = b.n;
  m.tq = b.tq;
  m.tk = b.tk;
  m.forward_flops = b.forward_flops;
  m.fwd_ms = fwd_ms;
  m.bwd_ms = bwd_ms;
  return m;
}

std::vector<Shape> missing_shapes(const GridSpec& spec, const std::map<Shape, Measurement>& measured) {
  std::vector<Shape> missing;
  for (const PlannedShape& p : shapes_to_time(spec)) {
    if (measured.count(p.shape) == 0) missing.push_back(p.shape);
  }
  return missing;
}

std::string table_json(const GridSpec& spec, const std::map<Shape, Measurement>& measured, const TableInfo& info) {
  validate(spec);
  const std::vector<Shape> missing = missing_shapes(spec, measured);
  if (!missing.empty()) {
    std::string list;
    for (const Shape& s : missing) list += (list.empty() ? "" : ", ") + to_string(s);
    throw std::runtime_error("refusing to write an incomplete table: " + std::to_string(missing.size()) +
                             " shape(s) (q, kv) not measured: " + list);
  }
  for (const auto& [shape, m] : measured) {
    const double f = m.fwd_tflops(), b = m.bwd_tflops();
    if (!(m.fwd_ms > 0) || !(m.bwd_ms > 0) || !std::isfinite(f) || !std::isfinite(b) || rounded(f) <= 0 ||
        rounded(b) <= 0) {
      throw std::runtime_error("shape " + to_string(shape) + ": times fwd " + short_number(m.fwd_ms) + " ms, bwd " +
                               short_number(m.bwd_ms) + " ms do not give rates > 0");
    }
  }

  nlohmann::ordered_json doc;
  doc["comment"] =
      "Attention-kernel rates, TFLOP/s, of the project's kernels on " + info.gpu + " (" + info.kernels +
      "), measured by bench/kernels/cad_measure_rate_table on " + info.date +
      (info.source_tag.empty() ? std::string() : " (" + info.source_tag + ")") + ": `" + info.command +
      "`. Each (q, kv) is one batch of n identical causal shards, each the last q queries of its own document of "
      "kv tokens (bottom-right causal), n = ceil(" + short_number(spec.target_gflop) +
      " GFLOP / shard forward FLOPs), and at least " + std::to_string(spec.min_units) +
      " forward units (128-query tiles x heads) in all, capped by " + std::to_string(spec.max_q_rows) + " query rows and " +
      std::to_string(spec.max_kv_rows) + " key rows (at least 1); median of " + std::to_string(info.reps) +
      " calls after " + std::to_string(info.warmups) +
      " warm-ups. FLOPs: causal forward 4*D*Hq*(q*kv - q(q-1)/2), backward 2.5x. Cells with q > kv "
      "('unreachable') copy the (kv, kv) shape. The dense entry is " +
      std::to_string(shards_for({spec.dense_len, spec.dense_len}, spec)) + " causal document(s) of " +
      std::to_string(spec.dense_len) + " tokens. Schema: planning/rate_table.h.";
  doc["gpu"] = info.gpu;
  doc["head_dim"] = spec.head_dim;
  doc["num_q_heads"] = spec.hq;
  doc["num_kv_heads"] = spec.hkv;
  doc["dtype"] = "bf16";
  doc["backward_flop_ratio"] = kBackwardFlopRatio;

  auto rates_of = [&](const Shape& cell, const std::string& prefix, nlohmann::ordered_json& into) {
    const Shape timed = timed_shape_of(cell);
    const Measurement& m = measured.at(timed);
    into["fwd"] = rate_json(m.fwd_tflops(), prefix + source_of(timed, m, spec, info, false));
    into["bwd"] = rate_json(m.bwd_tflops(), prefix + source_of(timed, m, spec, info, true));
  };
  nlohmann::ordered_json dense;
  dense["len"] = spec.dense_len;
  rates_of({spec.dense_len, spec.dense_len}, "", dense);
  doc["dense"] = dense;
  doc["q_lens"] = spec.q_lens;
  doc["kv_lens"] = spec.kv_lens;
  nlohmann::ordered_json grid = nlohmann::ordered_json::array();
  for (int64_t q : spec.q_lens) {
    for (int64_t kv : spec.kv_lens) {
      nlohmann::ordered_json cell;
      cell["q"] = q;
      cell["kv"] = kv;
      const std::string prefix =
          q > kv ? "unreachable: q > kv, copy of " + to_string(timed_shape_of({q, kv})) + " -- " : "";
      rates_of({q, kv}, prefix, cell);
      grid.push_back(cell);
    }
  }
  doc["grid"] = grid;
  return doc.dump(1) + "\n";
}

std::vector<int64_t> parse_lengths(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string word = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::string digits = word;
    int64_t scale = 1;
    if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
      digits.pop_back();
      scale = 1024;
    }
    const bool numeric = !digits.empty() && digits.size() <= 12 &&
                         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!numeric) {
      throw std::invalid_argument(flag + ": '" + word + "' in '" + text +
                                  "' is not a length (expected a comma-separated list like 32,128,4k)");
    }
    out.push_back(std::stoll(digits) * scale);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  check_axis(out, flag.c_str());
  return out;
}

}  // namespace cad::rates

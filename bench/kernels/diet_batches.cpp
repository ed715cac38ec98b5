// diet_batches.cpp -- see diet_batches.h.
#include "diet_batches.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "balancer_runner.h"
#include "batch_recipe.h"
#include "validate.h"

namespace cad::diet {

int64_t segment_entries(const cad_segment_v1_t& s) { return s.q_len * s.kv_len - s.q_len * (s.q_len - 1) / 2; }

int64_t batch_entries(const std::vector<cad_segment_v1_t>& segments) {
  int64_t total = 0;
  for (const cad_segment_v1_t& s : segments) total += segment_entries(s);
  return total;
}

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);) out.push_back(item);
  if (!text.empty() && text.back() == sep) out.push_back("");
  return out;
}

// A non-negative decimal integer that fits int64 (no sign, no spaces), or throws naming `what`.
int64_t parse_count(const std::string& text, const std::string& what) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw std::runtime_error(what + ": expected a non-negative integer below 10^18, got '" + text + "'");
  }
  return std::stoll(text);
}

// A positive integer at most `max`, with an optional k suffix (x1024) when `k_suffix`.
int64_t parse_positive(const std::string& text, int64_t max, bool k_suffix, const std::string& what) {
  std::string digits = text;
  int64_t scale = 1;
  if (k_suffix && !digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
    digits.pop_back();
    scale = 1024;
  }
  if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos ||
      std::stoll(digits) < 1 || std::stoll(digits) * scale > max) {
    throw std::runtime_error(what + ": expected an integer in [1, " + std::to_string(max) + "]" +
                             (k_suffix ? " (or N k)" : "") + ", got '" + text + "'");
  }
  return std::stoll(digits) * scale;
}

// 131072 -> "128k"; a count that is not a multiple of 1024 as it is.
std::string tokens_label(int64_t tokens) {
  return tokens % 1024 == 0 ? std::to_string(tokens / 1024) + "k" : std::to_string(tokens);
}

}  // namespace

DietSet parse_diet_set(const std::string& spec) {
  const std::vector<std::string> parts = split(spec, ':');
  const std::string where = "set '" + spec + "'";
  if (parts.size() != 4) {
    throw std::runtime_error(where + ": expected BALANCERS:SERVERS:TOKENS:PICK (4 parts separated by ':'), got " +
                             std::to_string(parts.size()));
  }
  DietSet set;
  for (const std::string& b : split(parts[0], ',')) {
    if (b.empty()) throw std::runtime_error(where + ": empty balancer name");
    set.balancers.push_back(b);
  }
  for (const std::string& n : split(parts[1], ',')) {
    set.servers.push_back(static_cast<int32_t>(parse_positive(n, 8192, false, where + " servers")));
  }
  for (const std::string& t : split(parts[2], ',')) {
    set.tokens.push_back(parse_positive(t, int64_t{1} << 30, true, where + " tokens"));
  }
  const std::string& p = parts[3];
  if (p == "extremes") set.pick = Pick::kExtremes;
  else if (p == "lightest") set.pick = Pick::kLightest;
  else if (p == "median") set.pick = Pick::kMedian;
  else if (p == "heaviest") set.pick = Pick::kHeaviest;
  else if (p == "all") set.pick = Pick::kAll;
  else throw std::runtime_error(where + ": PICK must be extremes, lightest, median, heaviest or all, got '" + p + "'");
  if (set.balancers.empty()) throw std::runtime_error(where + ": no balancer named");
  if (set.servers.empty()) throw std::runtime_error(where + ": no server count given");
  if (set.tokens.empty()) throw std::runtime_error(where + ": no token count given");
  return set;
}

std::vector<PlannedConfig> plan_configs(const std::vector<int64_t>& lengths, const GenerateOptions& options) {
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof cost;
  cost.num_q_heads = options.num_q_heads;
  cost.num_kv_heads = options.num_kv_heads;
  cost.head_dim = options.head_dim;
  cost.bytes_per_element = 2;  // bf16, what the kernels run
  cost.causal = 1;
  // One plugin instance per balancer, planning every config (as CAD keeps its balancer).
  std::map<std::string, std::unique_ptr<cad::simulate::BalancerRunner>> runners;
  std::vector<PlannedConfig> out;
  for (const DietSet& set : options.sets) {
    for (const std::string& balancer : set.balancers) {
      auto& runner = runners[balancer];
      if (!runner) runner = std::make_unique<cad::simulate::BalancerRunner>(balancer, "{}", options.plugin_path);
      for (int32_t servers : set.servers) {
        for (int64_t tokens : set.tokens) {
          PlannedConfig c;
          c.balancer = balancer;
          c.servers = servers;
          c.tokens = tokens;
          c.pick = set.pick;
          c.pieces = cad::workload::sample_batch(lengths, tokens, servers, options.seed);
          try {
            c.tasks = runner->plan(c.pieces, cost);
            // The layout assumes a valid plan; CAD checks it the same way before building one.
            cad::cad_plugin::check_plan(c.pieces, c.tasks, servers, balancer);
          } catch (const std::exception& e) {
            throw std::runtime_error(balancer + " at " + std::to_string(servers) + " servers x " +
                                     std::to_string(tokens) + " tokens: " + e.what());
          }
          c.layout = cad::cad_plugin::build_layout(c.pieces, c.tasks, true);
          out.push_back(std::move(c));
        }
      }
    }
  }
  return out;
}

std::vector<PickedServer> pick_servers(const cad::cad_plugin::Layout& layout, Pick pick) {
  const int32_t n = static_cast<int32_t>(layout.servers.size());
  std::vector<PickedServer> out;
  if (pick == Pick::kAll) {
    for (int32_t s = 0; s < n; ++s) out.push_back({s, "all"});
    return out;
  }
  if (n == 0) return out;
  std::vector<std::pair<int64_t, int32_t>> order;  // (entries, server): ties go to the lower index
  for (int32_t s = 0; s < n; ++s) order.push_back({batch_entries(layout.servers[static_cast<size_t>(s)].segments), s});
  std::sort(order.begin(), order.end());
  const size_t last = order.size() - 1, mid = last / 2;
  const bool extremes = pick == Pick::kExtremes;
  if (extremes || pick == Pick::kLightest) out.push_back({order.front().second, "lightest"});
  if (pick == Pick::kMedian || (extremes && mid != 0)) out.push_back({order[mid].second, "median"});
  if (pick == Pick::kHeaviest || (extremes && last != mid)) out.push_back({order.back().second, "heaviest"});
  return out;
}

std::vector<DietBatch> diet_batches(const std::vector<PlannedConfig>& configs) {
  std::vector<DietBatch> out;
  for (const PlannedConfig& c : configs) {
    for (const PickedServer& p : pick_servers(c.layout, c.pick)) {
      const cad::cad_plugin::ServerBatch& server = c.layout.servers[static_cast<size_t>(p.server)];
      DietBatch b;
      b.name = c.balancer + "_s" + std::to_string(c.servers) + "_t" + tokens_label(c.tokens) + "_" +
               p.label + "_r" + std::to_string(p.server);
      b.tq = server.q_rows;
      b.tk = server.kv_rows;
      b.segments = server.segments;
      out.push_back(std::move(b));
    }
  }
  return out;
}

std::string format_diet_line(const DietBatch& batch) {
  std::ostringstream line;
  line << batch.name << ' ' << batch.tq << ' ' << batch.tk << ' ' << batch.segments.size();
  for (const cad_segment_v1_t& s : batch.segments) {
    line << ' ' << s.q_offset << ',' << s.q_len << ',' << s.kv_offset << ',' << s.kv_len;
  }
  return line.str();
}

DietBatch parse_diet_line(const std::string& line, const std::string& where) {
  std::istringstream words(line);
  DietBatch b;
  std::string tq, tk, count;
  if (!(words >> b.name >> tq >> tk >> count)) {
    throw std::runtime_error(where + ": expected NAME TQ TK NSEG then the segments");
  }
  const std::string at = where + " (" + b.name + ")";
  b.tq = parse_count(tq, at + " TQ");
  b.tk = parse_count(tk, at + " TK");
  const int64_t n = parse_count(count, at + " NSEG");
  for (std::string word; words >> word;) {
    const std::string seg = at + " segment " + std::to_string(b.segments.size());
    std::vector<int64_t> v;
    std::istringstream fields(word);
    for (std::string f; std::getline(fields, f, ',');) v.push_back(parse_count(f, seg));
    if (v.size() != 4 || word.back() == ',') {
      throw std::runtime_error(seg + ": expected q_offset,q_len,kv_offset,kv_len, got '" + word + "'");
    }
    b.segments.push_back(cad_segment_v1_t{v[0], v[1], v[2], v[3]});
  }
  if (static_cast<int64_t>(b.segments.size()) != n) {
    throw std::runtime_error(at + ": NSEG says " + std::to_string(n) + " segments, the line has " +
                             std::to_string(b.segments.size()));
  }
  return b;
}

std::vector<DietBatch> read_diet_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<DietBatch> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    out.push_back(parse_diet_line(line, path + ":" + std::to_string(number)));
  }
  return out;
}

void check_diet_batch(const DietBatch& b) {
  for (size_t i = 0; i < b.segments.size(); ++i) {
    const cad_segment_v1_t& s = b.segments[i];
    const std::string seg = b.name + " segment " + std::to_string(i);
    if (s.q_len < 1 || s.kv_len < s.q_len) {
      throw std::runtime_error(seg + ": expected q_len >= 1 and kv_len >= q_len (causal), got q_len " +
                               std::to_string(s.q_len) + ", kv_len " + std::to_string(s.kv_len));
    }
    // Parsed values are below 10^18, so these sums cannot overflow.
    if (s.q_offset + s.q_len > b.tq || s.kv_offset + s.kv_len > b.tk) {
      throw std::runtime_error(seg + ": rows [" + std::to_string(s.q_offset) + ", +" + std::to_string(s.q_len) +
                               ") x [" + std::to_string(s.kv_offset) + ", +" + std::to_string(s.kv_len) +
                               ") outside the batch's " + std::to_string(b.tq) + " x " + std::to_string(b.tk));
    }
  }
}

}  // namespace cad::diet

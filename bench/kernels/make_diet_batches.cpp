// make_diet_batches.cpp -- the `cad_diet_batches` tool: writes CAD's real kernel diet (diet_batches.h)
// as a text file of server batches for bench/kernels/diet_bench.py. CPU only; deterministic for a seed.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "diet_batches.h"
#include "doc_lengths.h"

namespace {

using cad::diet::GenerateOptions;

// The default set: CAD's own balancer at every size, its lightest, median and heaviest server; at 256K
// only the heaviest server of three sizes, and the other balancers' median server at 64K and 128K
// (per_doc_cp up to 16 servers: its servers hold nearly every document's KV prefix, so at 32-64 servers a
// batch's K/V with their gradients and fp32 accumulators take 26-104 GB at D=128). 49 batches, 1.12e15
// forward FLOPs at D=128: three rounds at both head dims fit the few minutes run_diet.sh allows.
const std::vector<std::string> kDefaultSets = {
    "prefix_aware:4,8,16,32,64:64k,128k:extremes",
    "prefix_aware:4,16,64:256k:heaviest",
    "distca:4,8,16,32,64:64k,128k:median",
    "per_doc_cp:4,8,16:64k,128k:median",
};

std::string usage() {
  std::string u =
      "usage: cad_diet_batches [--dist FILE] [--set BALANCERS:SERVERS:TOKENS:PICK]... [--seed 1]\n"
      "                        [--path PLUGIN_DIRS] [--out FILE]\n"
      "Samples a Pretrain-recipe batch (DistCA recipe over the document lengths of --dist, default\n"
      "../shared/data/doclen_pretrain.json) for every servers x tokens-per-server config of each --set, plans\n"
      "it with each of the set's balancer plugins (through the ABI, Hq=32 Hkv=8 D=128 bf16 cost parameters)\n"
      "and builds every server's batch as CAD's layout does (segments q_offset,q_len,kv_offset,kv_len; shared\n"
      "KV prefixes). PICK keeps, per config, servers by score entries: extremes (lightest, median,\n"
      "heaviest), lightest, median, heaviest, or all. TOKENS are integers or N k (x1024), e.g.\n"
      "prefix_aware,distca:4,8:64k,128k:median. Writes one line per batch to --out (default stdout): NAME TQ\n"
      "TK NSEG then the segments; a summary (batches, FLOPs, a time estimate) goes to stderr.\n"
      "Default sets (used when no --set is given):\n";
  for (const std::string& s : kDefaultSets) u += "  --set " + s + "\n";
  return u;
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "cad_diet_batches: %s\n", message.c_str());
  std::exit(2);
}

struct Args {
  GenerateOptions gen;
  std::string dist = "../shared/data/doclen_pretrain.json";
  std::string out;
  std::string command;  // the command line, for the file's header
};

Args parse(int argc, char** argv) {
  Args a;
  a.command = "cad_diet_batches";
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string o = argv[i];
    if (o == "--help" || o == "-h") {
      std::printf("%s", usage().c_str());
      std::exit(0);
    }
    if (i + 1 >= argc) fail("option " + o + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (o == "--dist") {
      a.dist = v;
    } else if (o == "--set") {
      sets.push_back(v);
    } else if (o == "--seed") {
      if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
        fail("--seed: expected a non-negative integer, got '" + v + "'");
      }
      a.gen.seed = std::stoull(v);
    } else if (o == "--path") {
      a.gen.plugin_path = v;
    } else if (o == "--out") {
      a.out = v;
    } else {
      fail("unknown option " + o + " (see --help)");
    }
  }
  if (sets.empty()) sets = kDefaultSets;
  try {
    for (const std::string& s : sets) a.gen.sets.push_back(cad::diet::parse_diet_set(s));
  } catch (const std::exception& e) {
    fail(std::string("--set: ") + e.what());
  }
  // The header names every input, defaults included, so the file says how to make it again.
  a.command += " --dist " + a.dist + " --seed " + std::to_string(a.gen.seed);
  for (const std::string& s : sets) a.command += " --set " + s;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    const std::vector<int64_t> lengths = cad::workload::load_lengths(args.dist);
    const auto configs = cad::diet::plan_configs(lengths, args.gen);
    const auto batches = cad::diet::diet_batches(configs);
    std::ostringstream text;
    text << "# CAD server batches (bench/kernels/make_diet_batches.cpp): Pretrain-recipe batches planned by the\n"
         << "# balancer plugins, each server's batch laid out as CAD does (plugins/cad/layout.h).\n"
         << "# command: " << args.command << "\n"
         << "# lengths: " << lengths.size() << " documents; cost parameters Hq=" << args.gen.num_q_heads
         << " Hkv=" << args.gen.num_kv_heads << " D=" << args.gen.head_dim << " bf16 causal\n"
         << "# fields: NAME TQ TK NSEG, then NSEG segments q_offset,q_len,kv_offset,kv_len (causal, bottom-right)\n";
    for (const auto& b : batches) {
      cad::diet::check_diet_batch(b);  // what the kernels need; a layout bug would show here
      text << cad::diet::format_diet_line(b) << "\n";
    }
    if (args.out.empty()) {
      std::cout << text.str();
    } else {
      std::ofstream out(args.out);
      if (!(out << text.str()) || !out.flush()) throw std::runtime_error(args.out + ": cannot write");
    }
    // What timing the set costs: forward FLOPs at D=128 (D=64 is half), backward 2.5x.
    double entries = 0;
    for (const auto& b : batches) entries += static_cast<double>(cad::diet::batch_entries(b.segments));
    const double fwd128 = 4.0 * 128 * args.gen.num_q_heads * entries;
    std::fprintf(stderr,
                 "cad_diet_batches: %zu configs, %zu batches; forward %.3g FLOP at D=128 (%.3g at D=64); one "
                 "forward+backward of every batch at both head dims takes ~%.1f s at 450 TFLOP/s\n",
                 configs.size(), batches.size(), fwd128, fwd128 / 2, 3.5 * 1.5 * fwd128 / 450e12);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_diet_batches: %s\n", e.what());
    return 1;
  }
  return 0;
}

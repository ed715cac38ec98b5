// diet_batches_test.cpp -- the generator of CAD's kernel diet (bench/kernels/diet_batches.h): the server
// batches it writes are the ones the balancer plugins' plans and CAD's layout give (row counts per server
// recomputed from the plan, FLOPs summing to the batch's attention FLOPs), it is deterministic, the text
// format round-trips and its errors name the line, and the committed diet_batches.txt is well formed.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "diet_batches.h"
#include "doc_lengths.h"
#include "plan_model.h"

namespace {

using cad::diet::DietBatch;
using cad::diet::GenerateOptions;
using cad::diet::Pick;

GenerateOptions options(const std::vector<std::string>& sets, uint64_t seed = 1) {
  GenerateOptions o;
  for (const auto& s : sets) o.sets.push_back(cad::diet::parse_diet_set(s));
  o.seed = seed;
  o.plugin_path = CAD_BALANCER_PLUGIN_DIR;
  return o;
}

std::vector<int64_t> small_lengths() { return cad::workload::load_lengths(CAD_SMALL_LENGTHS); }

// The message of the std::runtime_error that `f` throws, or "accepted".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "accepted";
}

std::string text_of(const std::vector<DietBatch>& batches) {
  std::string out;
  for (const auto& b : batches) out += cad::diet::format_diet_line(b) + "\n";
  return out;
}

// A server batch as CAD's layout promises it: Q rows in segment order without gaps, every segment a
// causal segment inside the batch.
void expect_well_formed(const DietBatch& b) {
  EXPECT_NO_THROW(cad::diet::check_diet_batch(b)) << b.name;
  int64_t q = 0;
  for (const auto& s : b.segments) {
    EXPECT_EQ(s.q_offset, q) << b.name;
    q += s.q_len;
  }
  EXPECT_EQ(q, b.tq) << b.name;
}

// Every server of the config against the plan, computed here from the tasks alone: Q rows = the tasks'
// queries; K/V rows = per document, the longest prefix its tasks on that server read (the KV-prefix rule);
// score entries = the plan model's task costs; and over all servers, the batch's causal attention.
void expect_matches_plan(const cad::diet::PlannedConfig& c) {
  const std::string what = c.balancer + " " + std::to_string(c.servers) + " x " + std::to_string(c.tokens);
  std::map<int64_t, int64_t> doc_len;
  for (const auto& rank : c.pieces) {
    for (const auto& p : rank) doc_len[p.doc_id] = p.doc_len;
  }
  std::vector<int64_t> q_rows(static_cast<size_t>(c.servers)), entries(static_cast<size_t>(c.servers));
  std::vector<std::map<int64_t, int64_t>> prefix(static_cast<size_t>(c.servers));
  for (const auto& t : c.tasks) {
    const auto s = static_cast<size_t>(t.server);
    q_rows[s] += t.q_end - t.q_begin;
    entries[s] += cad::plan::task_cost(t.q_begin, t.q_end, doc_len.at(t.doc_id), true);
    int64_t& kv = prefix[s][t.doc_id];
    kv = std::max(kv, cad::plan::task_kv_end(t.q_begin, t.q_end, doc_len.at(t.doc_id), true));
  }
  ASSERT_EQ(c.layout.servers.size(), static_cast<size_t>(c.servers)) << what;
  int64_t total = 0;
  for (size_t s = 0; s < c.layout.servers.size(); ++s) {
    const auto& batch = c.layout.servers[s];
    int64_t kv_rows = 0;
    for (const auto& [doc, kv] : prefix[s]) kv_rows += kv;
    EXPECT_EQ(batch.q_rows, q_rows[s]) << what << " server " << s;
    EXPECT_EQ(batch.kv_rows, kv_rows) << what << " server " << s;
    EXPECT_EQ(cad::diet::batch_entries(batch.segments), entries[s]) << what << " server " << s;
    total += cad::diet::batch_entries(batch.segments);
    expect_well_formed(DietBatch{what, batch.q_rows, batch.kv_rows, batch.segments});
  }
  // Causal attention of the whole batch: every document's L(L+1)/2 score entries, wherever it is cut.
  int64_t expected = 0, tokens = 0;
  for (const auto& [doc, len] : doc_len) expected += len * (len + 1) / 2, tokens += len;
  EXPECT_EQ(total, expected) << what;
  EXPECT_EQ(tokens, int64_t{c.servers} * c.tokens) << what << ": the recipe fills every server";
}

TEST(DietBatches, EveryServerBatchIsThePlansOnSmallBatches) {
  const auto configs =
      cad::diet::plan_configs(small_lengths(), options({"prefix_aware,distca,per_doc_cp:1,3,4:1000,4096:all"}));
  ASSERT_EQ(configs.size(), 3u * 3u * 2u);
  for (const auto& c : configs) expect_matches_plan(c);
  // pick all: one batch per server, named after its config.
  const auto batches = cad::diet::diet_batches(configs);
  EXPECT_EQ(batches.size(), 3u * (1 + 3 + 4) * 2);
  EXPECT_EQ(batches.front().name, "prefix_aware_s1_t1000_all_r0");
  EXPECT_EQ(batches.back().name, "per_doc_cp_s4_t4k_all_r3");
}

TEST(DietBatches, EveryServerBatchIsThePlansOnPretrain) {
  std::ifstream probe(CAD_PRETRAIN_LENGTHS);
  if (!probe) GTEST_SKIP() << CAD_PRETRAIN_LENGTHS << " is absent";
  const auto lengths = cad::workload::load_lengths(CAD_PRETRAIN_LENGTHS);
  for (const auto& c : cad::diet::plan_configs(lengths, options({"prefix_aware,distca,per_doc_cp:4,16:64k:all"}))) {
    expect_matches_plan(c);
  }
}

TEST(DietBatches, DeterministicForASeed) {
  const auto o = options({"prefix_aware,distca:3,4:4096:extremes"});
  const std::string a = text_of(cad::diet::diet_batches(cad::diet::plan_configs(small_lengths(), o)));
  const std::string b = text_of(cad::diet::diet_batches(cad::diet::plan_configs(small_lengths(), o)));
  EXPECT_EQ(a, b);
  const auto other = options({"prefix_aware,distca:3,4:4096:extremes"}, 2);
  EXPECT_NE(a, text_of(cad::diet::diet_batches(cad::diet::plan_configs(small_lengths(), other))));
}

// A layout whose servers have the given segments (one segment each, q = kv = len).
cad::cad_plugin::Layout layout_of(const std::vector<int64_t>& lens) {
  cad::cad_plugin::Layout l;
  for (int64_t n : lens) {
    cad::cad_plugin::ServerBatch b;
    b.q_rows = b.kv_rows = n;
    b.segments.push_back({0, n, 0, n});
    l.servers.push_back(b);
  }
  l.world = static_cast<int32_t>(lens.size());
  return l;
}

std::string picks(const std::vector<cad::diet::PickedServer>& p) {
  std::string out;
  for (const auto& s : p) out += s.label + ":" + std::to_string(s.server) + " ";
  return out;
}

TEST(DietBatches, PicksLightestMedianHeaviestByEntriesTiesToTheLowerIndex) {
  const auto l = layout_of({5, 1, 9, 1});  // sorted: 1 (server 1), 1 (3), 5 (0), 9 (2)
  EXPECT_EQ(picks(cad::diet::pick_servers(l, Pick::kExtremes)), "lightest:1 median:3 heaviest:2 ");
  EXPECT_EQ(picks(cad::diet::pick_servers(l, Pick::kMedian)), "median:3 ");
  EXPECT_EQ(picks(cad::diet::pick_servers(l, Pick::kHeaviest)), "heaviest:2 ");
  EXPECT_EQ(picks(cad::diet::pick_servers(l, Pick::kLightest)), "lightest:1 ");
  EXPECT_EQ(picks(cad::diet::pick_servers(l, Pick::kAll)), "all:0 all:1 all:2 all:3 ");
  // Fewer servers than labels: each server once.
  EXPECT_EQ(picks(cad::diet::pick_servers(layout_of({7}), Pick::kExtremes)), "lightest:0 ");
  EXPECT_EQ(picks(cad::diet::pick_servers(layout_of({7, 3}), Pick::kExtremes)), "lightest:1 heaviest:0 ");
}

TEST(DietBatches, SetSpecsParseAndRefuseNamingThePart) {
  const auto s = cad::diet::parse_diet_set("prefix_aware,distca:4,8:64k,1000:median");
  EXPECT_EQ(s.balancers, (std::vector<std::string>{"prefix_aware", "distca"}));
  EXPECT_EQ(s.servers, (std::vector<int32_t>{4, 8}));
  EXPECT_EQ(s.tokens, (std::vector<int64_t>{65536, 1000}));
  EXPECT_EQ(s.pick, Pick::kMedian);
  auto refused = [](const std::string& spec) { return error_of([&] { cad::diet::parse_diet_set(spec); }); };
  EXPECT_NE(refused("prefix_aware:4:64k").find("4 parts"), std::string::npos);
  EXPECT_NE(refused("prefix_aware:0:64k:all").find("servers: expected an integer in [1, 8192]"), std::string::npos);
  EXPECT_NE(refused("prefix_aware:4:64x:all").find("tokens"), std::string::npos);
  EXPECT_NE(refused("prefix_aware:4:64k:most").find("PICK must be"), std::string::npos);
  EXPECT_NE(refused(":4:64k:all").find("no balancer named"), std::string::npos);
  EXPECT_NE(refused("prefix_aware::64k:all").find("no server count given"), std::string::npos);
  EXPECT_NE(refused("a,,b:4:64k:all").find("empty balancer name"), std::string::npos);
}

TEST(DietBatches, TextRoundTripsAndBadLinesAreNamed) {
  const DietBatch b{"x_s2_t4k_median_r1", 7, 12, {{0, 3, 0, 5}, {3, 4, 5, 7}}};
  const std::string line = cad::diet::format_diet_line(b);
  EXPECT_EQ(line, "x_s2_t4k_median_r1 7 12 2 0,3,0,5 3,4,5,7");
  const DietBatch back = cad::diet::parse_diet_line(line, "f:1");
  EXPECT_EQ(cad::diet::format_diet_line(back), line);
  auto error = [](const std::string& text) { return error_of([&] { cad::diet::parse_diet_line(text, "f.txt:9"); }); };
  EXPECT_NE(error("x 7 12").find("f.txt:9: expected NAME TQ TK NSEG"), std::string::npos);
  EXPECT_NE(error("x 7 12 3 0,3,0,5").find("f.txt:9 (x): NSEG says 3 segments, the line has 1"), std::string::npos);
  EXPECT_NE(error("x 7 12 1 0,3,0").find("segment 0: expected q_offset,q_len,kv_offset,kv_len"), std::string::npos);
  EXPECT_NE(error("x 7 12 1 0,3,0,5,").find("segment 0"), std::string::npos);
  EXPECT_NE(error("x -7 12 0").find("TQ: expected a non-negative integer"), std::string::npos);
  // Out of range and non-causal segments are refused by the check, naming the batch and segment.
  const DietBatch outside{"y", 7, 12, {{0, 3, 0, 5}, {3, 5, 5, 7}}};
  EXPECT_THROW(cad::diet::check_diet_batch(outside), std::runtime_error);
  const DietBatch acausal{"z", 7, 12, {{0, 6, 0, 5}}};
  EXPECT_NE(error_of([&] { cad::diet::check_diet_batch(acausal); })
                .find("z segment 0: expected q_len >= 1 and kv_len >= q_len"),
            std::string::npos);
}

TEST(DietBatches, FileReaderSkipsCommentsAndNamesTheLine) {
  const std::string path = ::testing::TempDir() + "diet_test.txt";
  {
    std::ofstream f(path);
    f << "# header\n\nx 7 12 2 0,3,0,5 3,4,5,7\n# note\ny 1 1 1 0,1,0,1\nz 1 1 1 0,1,0\n";
  }
  const std::string message = error_of([&] { cad::diet::read_diet_file(path); });
  EXPECT_NE(message.find(path + ":6 (z) segment 0"), std::string::npos) << message;
  {
    std::ofstream f(path);
    f << "# header\n\nx 7 12 2 0,3,0,5 3,4,5,7\n# note\ny 1 1 1 0,1,0,1\n";
  }
  const auto batches = cad::diet::read_diet_file(path);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].name, "y");
  std::remove(path.c_str());
  EXPECT_THROW(cad::diet::read_diet_file(path), std::runtime_error);
}

// The committed set (what diet_bench.py times on the GPU) is well formed and what its header says.
TEST(DietBatches, CommittedSetIsWellFormed) {
  const auto batches = cad::diet::read_diet_file(CAD_DIET_FILE);
  EXPECT_GE(batches.size(), 40u);
  std::set<std::string> names, balancers;
  for (const auto& b : batches) {
    EXPECT_TRUE(names.insert(b.name).second) << "duplicate " << b.name;
    balancers.insert(b.name.substr(0, b.name.find("_s")));
    expect_well_formed(b);
  }
  EXPECT_EQ(balancers, (std::set<std::string>{"prefix_aware", "distca", "per_doc_cp"}));
  std::ifstream f(CAD_DIET_FILE);
  std::string first, second, third;
  std::getline(f, first), std::getline(f, second), std::getline(f, third);
  EXPECT_EQ(third.rfind("# command: cad_diet_batches --dist ", 0), 0u) << third;
}

}  // namespace

// workload_test.cpp -- reading document lengths, packing, and the DistCA recipe's imbalance.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include "batch_recipe.h"
#include "doc_lengths.h"
#include "plan_model.h"

namespace {

using cad::workload::LengthsError;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const LengthsError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DocLengths, ParsesJsonAndCsv) {
  EXPECT_EQ(cad::workload::parse_lengths_json("[3, 1, 65536]", "x.json"), (std::vector<int64_t>{3, 1, 65536}));
  EXPECT_EQ(cad::workload::parse_lengths_csv("length,source\n7,a\n\n9\n", "x.csv"), (std::vector<int64_t>{7, 9}));
}

TEST(DocLengths, ErrorsNameTheFileAndTheEntry) {
  EXPECT_NE(message_of([] { cad::workload::parse_lengths_json("[3, -1]", "d.json"); }).find("d.json: entry [1]"),
            std::string::npos);
  EXPECT_NE(message_of([] { cad::workload::parse_lengths_json("[3, 2.5]", "d.json"); }).find("entry [1]"),
            std::string::npos);
  EXPECT_NE(message_of([] { cad::workload::parse_lengths_json("{}", "d.json"); }).find("JSON list"), std::string::npos);
  EXPECT_NE(message_of([] { cad::workload::parse_lengths_csv("5\n6\nsix\n", "d.csv"); }).find("d.csv:3"),
            std::string::npos);
  EXPECT_NE(message_of([] { cad::workload::parse_lengths_csv("5\n0\n", "d.csv"); }).find("d.csv:2"),
            std::string::npos);
  EXPECT_NE(message_of([] { cad::workload::load_lengths("/nonexistent/x.json"); }).find("/nonexistent/x.json"),
            std::string::npos);
}

TEST(DocLengths, LoadsFromFiles) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto json = dir / "cad_balancers_lengths_test.json";
  const auto csv = dir / "cad_balancers_lengths_test.csv";
  std::ofstream(json) << "[4, 5]";
  std::ofstream(csv) << "4\n5\n";
  EXPECT_EQ(cad::workload::load_lengths(json.string()), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(cad::workload::load_lengths(csv.string()), (std::vector<int64_t>{4, 5}));
  std::filesystem::remove(json);
  std::filesystem::remove(csv);
}

// `cad simulate --dist /dev/zero` read until memory ran out: devices and pipes are refused by type, and a
// regular file only up to the cap (a sparse file: no disk is used).
TEST(DocLengths, RefusesDevicesAndFilesAboveTheCap) {
  EXPECT_NE(message_of([] { cad::workload::load_lengths("/dev/zero"); }).find("/dev/zero: not a regular file"),
            std::string::npos);
  const auto big = std::filesystem::temp_directory_path() / "cad_balancers_lengths_big.csv";
  std::ofstream(big) << "4\n";
  std::filesystem::resize_file(big, static_cast<uintmax_t>(cad::workload::kMaxLengthsFileBytes) + 1);
  EXPECT_NE(message_of([&] { cad::workload::load_lengths(big.string()); }).find("larger than 32 MiB"),
            std::string::npos);
  std::filesystem::resize_file(big, static_cast<uintmax_t>(cad::workload::kMaxLengthsFileBytes));
  // At the cap it is read (and the NULs the sparse file holds are then reported as a bad line).
  EXPECT_NE(message_of([&] { cad::workload::load_lengths(big.string()); }).find("cad_balancers_lengths_big.csv:"),
            std::string::npos);
  std::filesystem::remove(big);
}

TEST(Pack, FillsBuffersInOrderAndCutsOverflows) {
  // Buffers of 10: doc 0 (7) fits, doc 1 (25) spans ranks 0..3, doc 2 (9) is truncated to the 8 tokens left.
  const auto ranks = cad::workload::pack({7, 25, 9}, 10, 4);
  ASSERT_EQ(ranks.size(), 4u);
  const std::vector<std::vector<std::array<int64_t, 4>>> want = {
      {{0, 7, 0, 7}, {1, 25, 0, 3}}, {{1, 25, 3, 10}}, {{1, 25, 13, 10}}, {{1, 25, 23, 2}, {2, 8, 0, 8}}};
  for (size_t r = 0; r < 4; ++r) {
    ASSERT_EQ(ranks[r].size(), want[r].size()) << r;
    for (size_t i = 0; i < want[r].size(); ++i) {
      const auto& p = ranks[r][i];
      EXPECT_EQ((std::array<int64_t, 4>{p.doc_id, p.doc_len, p.offset_in_doc, p.len}), want[r][i]) << r << " " << i;
    }
  }
  // With 3 buffers, document 1 is cut at the end of the last one (23 of its 25 tokens) and keeps tiling
  // [0, doc_len); document 2 is left out.
  const auto short_batch = cad::workload::pack({7, 25, 9}, 10, 3);
  for (const auto& r : short_batch)
    for (const auto& p : r) EXPECT_NE(p.doc_id, 2);
  const auto& last = short_batch[2].back();
  EXPECT_EQ((std::array<int64_t, 4>{last.doc_id, last.doc_len, last.offset_in_doc, last.len}),
            (std::array<int64_t, 4>{1, 23, 13, 10}));
}

TEST(Recipe, IsDeterministicAndScalesWithContext) {
  const std::vector<int64_t> lengths = {100, 70000, 3, 65536, 2000, 131072 + 5};
  const auto a = cad::workload::recipe_documents(lengths, 65536, 9);
  EXPECT_EQ(a, cad::workload::recipe_documents(lengths, 65536, 9));
  // Cut at 64K: 70000 -> 64K (twice) + 4464; 65536 -> twice; 131077 -> 64K twice, 64K twice, 5.
  EXPECT_EQ(std::count(a.begin(), a.end(), 65536), 8);
  for (int64_t x : a) EXPECT_LE(x, 65536);
  const auto b = cad::workload::recipe_documents(lengths, 131072, 9);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], 2 * a[i]);
}

double mean_ratio(const std::vector<int64_t>& lengths, int32_t ranks, int seeds) {
  double sum = 0;
  for (int s = 0; s < seeds; ++s) {
    const auto batch = cad::workload::sample_batch(lengths, 65536, ranks, 500 + s);
    int64_t tokens = 0;
    for (const auto& r : batch)
      for (const auto& p : r) tokens += p.len;
    EXPECT_EQ(tokens, 65536 * int64_t{ranks});
    sum += cad::plan::imbalance_of(cad::workload::causal_cost_per_rank(batch));
  }
  return sum / seeds;
}

TEST(Recipe, ReproducesTheReadmeImbalanceOnPretrain) {
  if (!std::filesystem::exists(CAD_PRETRAIN_LENGTHS)) GTEST_SKIP() << CAD_PRETRAIN_LENGTHS << " not found";
  const auto lengths = cad::workload::load_lengths(CAD_PRETRAIN_LENGTHS);
  ASSERT_EQ(lengths.size(), 99519u);
  // README: about 2.1 at 4 ranks, 3.0 at 8, 4.0 at 32 (averaged over batches; one batch varies a lot).
  const double r4 = mean_ratio(lengths, 4, 16);
  const double r8 = mean_ratio(lengths, 8, 16);
  const double r32 = mean_ratio(lengths, 32, 8);
  EXPECT_GT(r4, 1.7);
  EXPECT_LT(r4, 2.5);
  EXPECT_GT(r8, 2.4);
  EXPECT_LT(r8, 3.8);
  EXPECT_GT(r32, 3.2);
  EXPECT_LT(r32, 4.8);
  RecordProperty("ratio_4", std::to_string(r4));
  RecordProperty("ratio_8", std::to_string(r8));
  RecordProperty("ratio_32", std::to_string(r32));
  std::printf("recipe max/mean causal cost: 4 ranks %.2f, 8 ranks %.2f, 32 ranks %.2f\n", r4, r8, r32);
}

}  // namespace

// The system calibration file: the shipped one loads, and every missing or bad key is refused with a
// message naming the file and the key.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "attention_rates.h"
#include "system_calibration.h"

namespace sim = cad::simulate;

namespace {

nlohmann::json good() {
  return nlohmann::json::parse(R"({
    "gpu": "G",
    "gemm": {"tflops": 600, "source": "s"},
    "elementwise": {"hbm_GBps": 4000, "bytes_per_token_layer_per_hidden": 48, "source": "s"},
    "all_to_all_intra_node": {"source": "s", "points": [{"bytes_per_rank": 1000, "busbw_GBps": 5},
                                                       {"bytes_per_rank": 2000, "busbw_GBps": 50}]},
    "network": {"GBps_per_gpu": 50, "efficiency": 0.8, "latency_us": 20, "source": "s"}})");
}

std::string refusal(const nlohmann::json& doc) {
  try {
    sim::parse_system_calibration(doc.dump(), "sys.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST(SimulateCalibration, ShippedFilesLoad) {
  const sim::SystemCalibration c = sim::load_system_calibration(CAD_CALIBRATION_DIR "/h200_system.json");
  EXPECT_EQ(c.gpu, "NVIDIA H200");
  EXPECT_GT(c.gemm_tflops, 0);
  EXPECT_GE(c.a2a_intra.size(), 2u);
  EXPECT_NE(c.a2a_intra_source.find("docs/nccl.md"), std::string::npos);
  const auto rates = sim::load_attention_rates(CAD_CALIBRATION_DIR "/h200.json");
  EXPECT_EQ(rates->head_dim(), 128);
  EXPECT_GT(rates->fwd_tflops(1024, 65536), 100);
}

TEST(SimulateCalibration, GoodParses) {
  const sim::SystemCalibration c = sim::parse_system_calibration(good().dump(), "sys.json");
  EXPECT_DOUBLE_EQ(c.gemm_tflops, 600);
  EXPECT_DOUBLE_EQ(c.a2a_intra[1].busbw_GBps, 50);
  EXPECT_DOUBLE_EQ(c.net_efficiency, 0.8);
}

TEST(SimulateCalibration, MissingAndBadKeysAreNamed) {
  auto without = [](const std::string& section, const std::string& key) {
    nlohmann::json d = good();
    if (key.empty()) d.erase(section);
    else d[section].erase(key);
    return refusal(d);
  };
  EXPECT_EQ(without("gemm", "tflops"), "sys.json: key 'gemm.tflops' is missing (expected a number > 0)");
  EXPECT_EQ(without("gemm", "source"), "sys.json: key 'gemm.source' is missing (expected a non-empty string)");
  EXPECT_EQ(without("network", ""), "sys.json: key 'network' is missing (expected an object)");
  EXPECT_EQ(without("all_to_all_intra_node", "points"),
            "sys.json: key 'all_to_all_intra_node.points' is missing (expected a non-empty list)");
  EXPECT_EQ(without("elementwise", "hbm_GBps"), "sys.json: key 'elementwise.hbm_GBps' is missing (expected a number > 0)");

  nlohmann::json d = good();
  d["gemm"]["tflops"] = -1;
  EXPECT_EQ(refusal(d), "sys.json: key 'gemm.tflops' must be a number > 0, got -1");
  d = good();
  d["network"]["efficiency"] = 1.5;
  EXPECT_NE(refusal(d).find("key 'network.efficiency' must be in (0, 1]"), std::string::npos);
  d = good();
  d["all_to_all_intra_node"]["points"][1]["bytes_per_rank"] = 1000;
  EXPECT_EQ(refusal(d), "sys.json: key 'all_to_all_intra_node.points[1].bytes_per_rank' must be larger than the "
                        "previous point's (strictly increasing)");
  d = good();
  d["all_to_all_intra_node"]["points"] = nlohmann::json::array();
  EXPECT_NE(refusal(d).find("'all_to_all_intra_node.points' must be a non-empty list"), std::string::npos);
  d = good();
  d["all_to_all_intra_node"]["points"][0].erase("busbw_GBps");
  EXPECT_EQ(refusal(d), "sys.json: key 'all_to_all_intra_node.points[0].busbw_GBps' is missing (expected a number > 0)");
  EXPECT_THROW(sim::parse_system_calibration("{", "x.json"), std::invalid_argument);
  EXPECT_THROW(sim::load_system_calibration("/nonexistent/sys.json"), std::invalid_argument);
}

TEST(SimulateCalibration, FixedRatesRefuseNonPositive) {
  EXPECT_THROW(sim::constant_rates(0, 1, 2.5), std::invalid_argument);
  EXPECT_THROW(sim::constant_rates(1, 1, 0), std::invalid_argument);
  EXPECT_DOUBLE_EQ(sim::constant_rates(3, 2, 2.5)->bwd_tflops(1, 1), 2);
}

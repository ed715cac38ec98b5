// system_calibration.cpp -- reading and checking a system calibration file.
#include "system_calibration.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "bounded_file.h"

namespace cad::simulate {

namespace {

using nlohmann::json;

// Field readers: each names the file and the dotted key in its refusal.
struct Reader {
  const std::string& file;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::invalid_argument(file + ": key '" + key + "' " + what);
  }
  const json& object(const json& parent, const std::string& key, const std::string& path) const {
    if (!parent.contains(key)) fail(path, "is missing (expected an object)");
    const json& v = parent.at(key);
    if (!v.is_object()) fail(path, "must be an object, got " + v.dump());
    return v;
  }
  double positive(const json& parent, const std::string& key, const std::string& path) const {
    if (!parent.contains(key)) fail(path, "is missing (expected a number > 0)");
    const json& v = parent.at(key);
    if (!v.is_number() || !(v.get<double>() > 0)) fail(path, "must be a number > 0, got " + v.dump());
    return v.get<double>();
  }
  double non_negative(const json& parent, const std::string& key, const std::string& path) const {
    if (!parent.contains(key)) fail(path, "is missing (expected a number >= 0)");
    const json& v = parent.at(key);
    if (!v.is_number() || !(v.get<double>() >= 0)) fail(path, "must be a number >= 0, got " + v.dump());
    return v.get<double>();
  }
  std::string text(const json& parent, const std::string& key, const std::string& path) const {
    if (!parent.contains(key)) fail(path, "is missing (expected a non-empty string)");
    const json& v = parent.at(key);
    if (!v.is_string() || v.get<std::string>().empty()) fail(path, "must be a non-empty string, got " + v.dump());
    return v.get<std::string>();
  }
};

}  // namespace

SystemCalibration parse_system_calibration(const std::string& json_text, const std::string& name) {
  const json doc = json::parse(json_text, nullptr, false);
  if (doc.is_discarded()) throw std::invalid_argument(name + ": not valid JSON");
  if (!doc.is_object()) throw std::invalid_argument(name + ": expected a JSON object at the top level");
  const Reader r{name};
  SystemCalibration c;
  c.path = name;
  c.gpu = r.text(doc, "gpu", "gpu");

  const json& gemm = r.object(doc, "gemm", "gemm");
  c.gemm_tflops = r.positive(gemm, "tflops", "gemm.tflops");
  c.gemm_source = r.text(gemm, "source", "gemm.source");

  const json& ew = r.object(doc, "elementwise", "elementwise");
  c.hbm_GBps = r.positive(ew, "hbm_GBps", "elementwise.hbm_GBps");
  c.elementwise_bytes_per_token_layer_per_hidden =
      r.non_negative(ew, "bytes_per_token_layer_per_hidden", "elementwise.bytes_per_token_layer_per_hidden");
  c.elementwise_source = r.text(ew, "source", "elementwise.source");

  const json& a2a = r.object(doc, "all_to_all_intra_node", "all_to_all_intra_node");
  c.a2a_intra_source = r.text(a2a, "source", "all_to_all_intra_node.source");
  if (!a2a.contains("points")) r.fail("all_to_all_intra_node.points", "is missing (expected a non-empty list)");
  const json& points = a2a.at("points");
  if (!points.is_array() || points.empty()) {
    r.fail("all_to_all_intra_node.points", "must be a non-empty list of {bytes_per_rank, busbw_GBps}");
  }
  for (size_t i = 0; i < points.size(); ++i) {
    const std::string at = "all_to_all_intra_node.points[" + std::to_string(i) + "]";
    if (!points[i].is_object()) r.fail(at, "must be an object {bytes_per_rank, busbw_GBps}");
    CurvePoint p;
    p.bytes = r.positive(points[i], "bytes_per_rank", at + ".bytes_per_rank");
    p.busbw_GBps = r.positive(points[i], "busbw_GBps", at + ".busbw_GBps");
    if (!c.a2a_intra.empty() && !(p.bytes > c.a2a_intra.back().bytes)) {
      r.fail(at + ".bytes_per_rank", "must be larger than the previous point's (strictly increasing)");
    }
    c.a2a_intra.push_back(p);
  }

  const json& net = r.object(doc, "network", "network");
  c.net_GBps_per_gpu = r.positive(net, "GBps_per_gpu", "network.GBps_per_gpu");
  c.net_efficiency = r.positive(net, "efficiency", "network.efficiency");
  if (c.net_efficiency > 1) r.fail("network.efficiency", "must be in (0, 1], got " + std::to_string(c.net_efficiency));
  c.net_latency_us = r.non_negative(net, "latency_us", "network.latency_us");
  c.net_source = r.text(net, "source", "network.source");
  return c;
}

std::vector<LinkPoint> parse_link_curve(const std::string& json_text, const std::string& name, std::string* source) {
  const json doc = json::parse(json_text, nullptr, false);
  if (doc.is_discarded()) throw std::invalid_argument(name + ": not valid JSON");
  if (!doc.is_object()) throw std::invalid_argument(name + ": expected a JSON object at the top level");
  const Reader r{name};
  const std::string src = r.text(doc, "source", "source");
  if (source != nullptr) *source = src;
  if (!doc.contains("points")) r.fail("points", "is missing (expected a non-empty list of {bytes, seconds})");
  const json& points = doc.at("points");
  if (!points.is_array() || points.empty()) r.fail("points", "must be a non-empty list of {bytes, seconds}");
  std::vector<LinkPoint> out;
  for (size_t i = 0; i < points.size(); ++i) {
    const std::string at = "points[" + std::to_string(i) + "]";
    if (!points[i].is_object()) r.fail(at, "must be an object {bytes, seconds}");
    LinkPoint p;
    p.bytes = r.positive(points[i], "bytes", at + ".bytes");
    p.seconds = r.positive(points[i], "seconds", at + ".seconds");
    if (!out.empty() && !(p.bytes > out.back().bytes)) {
      r.fail(at + ".bytes", "must be larger than the previous point's (strictly increasing)");
    }
    if (!out.empty() && p.seconds < out.back().seconds) {
      r.fail(at + ".seconds", "must not be smaller than the previous point's (more bytes never take less time)");
    }
    out.push_back(p);
  }
  return out;
}

std::vector<LinkPoint> load_link_curve(const std::string& path, std::string* source) {
  std::string text, error;
  if (files::read_regular_file(path, files::kMaxJsonFileBytes, "link curve", &text, &error) != files::ReadStatus::kOk) {
    throw std::invalid_argument(error);
  }
  return parse_link_curve(text, path, source);
}

SystemCalibration load_system_calibration(const std::string& path) {
  // A regular file of at most 16 MiB (bounded_file.h): a FIFO or /dev/zero is refused, not read.
  std::string text, error;
  if (files::read_regular_file(path, files::kMaxJsonFileBytes, "system calibration", &text, &error) !=
      files::ReadStatus::kOk) {
    throw std::invalid_argument(error);
  }
  return parse_system_calibration(text, path);
}

}  // namespace cad::simulate

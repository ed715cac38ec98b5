// trainer_calibration.cpp -- reading and checking a trainer calibration file (trainer_calibration.h).
#include "trainer_calibration.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "bounded_file.h"

namespace cad::simulate {

namespace {

using nlohmann::json;

struct Reader {
  const std::string& file;
  const json& doc;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::invalid_argument(file + ": key '" + key + "' " + what);
  }
  // A finite number >= lo (or > lo when `strict`).
  double number(const std::string& key, double lo, bool strict) const {
    const std::string expect = std::string("a number ") + (strict ? "> " : ">= ") + (lo == 0 ? "0" : "1");
    if (!doc.contains(key)) fail(key, "is missing (expected " + expect + ")");
    const json& v = doc.at(key);
    const bool ok = v.is_number() && std::isfinite(v.get<double>()) &&
                    (strict ? v.get<double>() > lo : v.get<double>() >= lo);
    if (!ok) fail(key, "must be " + expect + ", got " + v.dump());
    return v.get<double>();
  }
  std::string text(const std::string& key) const {
    if (!doc.contains(key)) fail(key, "is missing (expected a non-empty string)");
    const json& v = doc.at(key);
    if (!v.is_string() || v.get<std::string>().empty()) fail(key, "must be a non-empty string, got " + v.dump());
    return v.get<std::string>();
  }
};

}  // namespace

TrainerCalibration parse_trainer_calibration(const std::string& json_text, const std::string& name) {
  const json doc = json::parse(json_text, nullptr, false);
  if (doc.is_discarded()) throw std::invalid_argument(name + ": not valid JSON");
  if (!doc.is_object()) throw std::invalid_argument(name + ": expected a JSON object at the top level");
  const Reader r{name, doc};
  TrainerCalibration c;
  c.path = name;
  c.trainer = r.text("trainer");
  if (!doc.contains("fitted_on") || !doc.at("fitted_on").is_array() || doc.at("fitted_on").empty()) {
    r.fail("fitted_on", "must be a non-empty list of the runs the terms were fitted to");
  }
  for (const json& run : doc.at("fitted_on")) {
    if (!run.is_string()) r.fail("fitted_on", "must hold strings, got " + run.dump());
    c.fitted_on += (c.fitted_on.empty() ? "" : ",") + run.get<std::string>();
  }
  c.layer_us_per_token = r.number("layer_us_per_token", 0, false);
  c.head_us_per_token = r.number("head_us_per_token", 0, false);
  c.step_fixed_ms = r.number("step_fixed_ms", 0, false);
  c.attention_scale = r.number("attention_scale", 0, true);
  c.torch_varlen_attention_scale = r.number("torch_varlen_attention_scale", 0, true);
  c.attention_call_us = r.number("attention_call_us", 0, false);
  c.plan_make_ms = r.number("plan_make_ms", 0, false);
  c.plan_make_ns_per_token = r.number("plan_make_ns_per_token", 0, false);
  c.plan_make_us_per_task = r.number("plan_make_us_per_task", 0, false);
  c.exchange_fixed_us = r.number("exchange_fixed_us", 0, false);
  c.pack_unpack_ns_per_byte = r.number("pack_unpack_ns_per_byte", 0, false);
  c.pingpong_compute_factor = r.number("pingpong_compute_factor", 1, false);
  if (!doc.contains("source") || !doc.at("source").is_object()) {
    r.fail("source", "is missing (expected an object: for each term, the runs and how it was fitted)");
  }
  for (const auto& [key, value] : doc.at("source").items()) {
    if (!value.is_string()) r.fail("source." + key, "must be a string, got " + value.dump());
    c.source[key] = value.get<std::string>();
  }
  return c;
}

TrainerCalibration load_trainer_calibration(const std::string& path) {
  // A regular file of at most 16 MiB (bounded_file.h): a FIFO or /dev/zero is refused, not read.
  std::string text, error;
  if (files::read_regular_file(path, files::kMaxJsonFileBytes, "trainer calibration", &text, &error) !=
      files::ReadStatus::kOk) {
    throw std::invalid_argument(error);
  }
  return parse_trainer_calibration(text, path);
}

}  // namespace cad::simulate

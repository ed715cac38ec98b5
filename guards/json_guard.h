// json_guard.h -- parsing untrusted JSON (stack configs, plugin configs, document-length files) so that
// hostile input is reported, never a crash:
//  - nesting is limited (kMaxJsonDepth): nlohmann's parser is iterative, but dump() and the walkers
//    built on it recurse, so a 100K-deep config (200 KB) overflowed the stack of the calling trainer;
//  - every failure (syntax, a number too large for a double, too deep) becomes one JsonInputError
//    whose message names the key path where it happened, e.g. "instances[2].config.timeout_ms",
//    instead of an exception type the caller did not expect (nlohmann reports a too-large number as
//    out_of_range, which escaped as INTERNAL with no file or key).
// Header-only; used by the host adapter, the plugins' ConfigReader, the workload reader and the fuzzers.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cad::json_guard {

// Deeper than any real config (they nest 3-4 levels); small enough that recursion over it is safe.
constexpr int kMaxJsonDepth = 64;

class JsonInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

// Where the parser is: one frame per open object/array. For an array, `count` is the number of
// elements completed, i.e. the index of the element being read.
struct PathTracker {
  struct Frame {
    bool array;
    std::string key;
    long long count;
  };
  std::vector<Frame> frames;
  int max_depth;

  std::string path() const {
    std::string out;
    for (const Frame& f : frames) {
      if (f.array) {
        out += "[" + std::to_string(f.count) + "]";
      } else if (!f.key.empty() || !out.empty()) {
        out += (out.empty() ? "" : ".") + f.key;
      }
    }
    return out.empty() ? "(top level)" : out;
  }
  void element_done() {
    if (!frames.empty() && frames.back().array) ++frames.back().count;
  }
};

}  // namespace detail

// Parses `text`; `source` (a file name, "plugin 'mpi' config") starts every message.
inline nlohmann::json parse(const std::string& text, const std::string& source, int max_depth = kMaxJsonDepth) {
  using nlohmann::json;
  auto tracker = std::make_shared<detail::PathTracker>();
  tracker->max_depth = max_depth;
  const json::parser_callback_t callback = [tracker](int, json::parse_event_t event, json& parsed) {
    detail::PathTracker& t = *tracker;
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(t.frames.size()) >= t.max_depth) {
          throw JsonInputError("nested more than " + std::to_string(t.max_depth) + " levels deep (at " + t.path() + ")");
        }
        t.frames.push_back({event == json::parse_event_t::array_start, "", 0});
        break;
      case json::parse_event_t::key:
        if (!t.frames.empty()) t.frames.back().key = parsed.get<std::string>();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!t.frames.empty()) t.frames.pop_back();
        t.element_done();
        break;
      case json::parse_event_t::value:
        t.element_done();
        break;
    }
    return true;
  };
  try {
    return json::parse(text, callback);
  } catch (const JsonInputError& e) {
    throw JsonInputError(source + ": " + e.what());
  } catch (const json::exception& e) {
    // parse_error (syntax) and out_of_range (a number literal beyond a double's range).
    throw JsonInputError(source + ": not valid JSON: " + e.what() + " (at " + tracker->path() + ")");
  }
}

}  // namespace cad::json_guard

// doc_lengths.cpp -- see doc_lengths.h.
#include "doc_lengths.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bounded_file.h"
#include "json_guard.h"

namespace cad::workload {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

std::vector<int64_t> parse_lengths_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    // A flat list: anything nested inside it is an error anyway, so depth 2 is enough to name it.
    j = json_guard::parse(text, source, 2);
  } catch (const json_guard::JsonInputError& e) {
    throw LengthsError(e.what());
  }
  if (!j.is_array()) throw LengthsError(source + ": expected a JSON list of document lengths");
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    // get<int64_t> of an unsigned above INT64_MAX would wrap: test the sign-independent range first.
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(kMaxDocumentTokens)
                                                 : v.is_number_integer() && v.get<int64_t>() <= kMaxDocumentTokens;
    if (!in_range || v.get<int64_t>() < 1) {
      std::string shown = v.dump();
      if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
      throw LengthsError(source + ": entry [" + std::to_string(i) + "] is " + shown + ", expected an integer in [1, " +
                         std::to_string(kMaxDocumentTokens) + "]");
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

std::vector<int64_t> parse_lengths_csv(const std::string& text, const std::string& source) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::string field = trim(line.substr(0, line.find(',')));
    if (field.empty() || field[0] == '#') continue;
    size_t used = 0;
    long long value = 0;
    bool ok = true;
    try {
      value = std::stoll(field, &used);
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok || used != field.size()) {
      if (out.empty() && number == 1) continue;  // a header line
      ok = false;
    }
    if (!ok || value < 1 || value > kMaxDocumentTokens) {
      // Quote at most 40 bytes: a binary file's "line" can be megabytes long.
      const std::string shown = field.size() > 40 ? field.substr(0, 37) + "..." : field;
      throw LengthsError(source + ":" + std::to_string(number) + ": '" + shown + "' is not an integer in [1, " +
                         std::to_string(kMaxDocumentTokens) + "]");
    }
    out.push_back(value);
  }
  return out;
}

std::vector<int64_t> load_lengths(const std::string& path) {
  // A device or a pipe (/dev/zero, /dev/stdin, a FIFO) has no end to read to: refuse it by type, and
  // read even a regular file only up to the cap (it may grow while it is read).
  // (bounded_file.h: the one check every file a user names gets.)
  std::string text, error;
  const files::ReadStatus read = files::read_regular_file(path, kMaxLengthsFileBytes, "", &text, &error);
  if (read == files::ReadStatus::kNotRegular) {
    throw LengthsError(error + "; expected a JSON list or CSV file of document lengths");
  }
  if (read != files::ReadStatus::kOk) throw LengthsError(error);
  return ends_with(path, ".json") ? parse_lengths_json(text, path) : parse_lengths_csv(text, path);
}

}  // namespace cad::workload

// doc_lengths.h -- reading a list of document lengths (tokens) from a file: a JSON list of integers, or
// CSV/text with one length per line (an optional header line, extra columns after a comma ignored).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cad::workload {

// Thrown with a message naming the file and the index (JSON) or line (CSV) of the bad entry.
class LengthsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The longest document a file may list: 2^40 tokens, the largest context `cad plan` takes. Longer ones
// are refused naming the entry; so are lists nested deeper than a flat list allows (no crash).
constexpr int64_t kMaxDocumentTokens = int64_t{1} << 40;

// The largest length file read: 32 MiB, about 16M documents, 55x the Pretrain distribution's file. It
// bounds what a mistaken path (a log, a dataset) costs in memory before the parse names the problem.
constexpr int64_t kMaxLengthsFileBytes = int64_t{32} << 20;

// Chooses the format by extension: ".json" is a JSON list, anything else one length per line.
// Every length must be an integer in [1, kMaxDocumentTokens]. Only regular files of at most
// kMaxLengthsFileBytes are read (a device such as /dev/zero or a pipe is refused by type).
std::vector<int64_t> load_lengths(const std::string& path);

// The same, from text already in memory; `source` names it in errors.
std::vector<int64_t> parse_lengths_json(const std::string& text, const std::string& source);
std::vector<int64_t> parse_lengths_csv(const std::string& text, const std::string& source);

}  // namespace cad::workload

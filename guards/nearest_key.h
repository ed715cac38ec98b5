// nearest_key.h -- "did you mean 'timeout_ms'?" for an unknown config key. A typo in an optional key
// is only warned about (the key is ignored and its default silently used), so the warning must point
// at the key that was meant. Header-only: shared by the host's config check and every plugin's
// ConfigReader (plugins never link host symbols).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <vector>

namespace cad::keys {

// Edit distance (insert, delete, substitute one character), ignoring case and counting '-' as '_':
// "Timeout-MS" is one edit from nothing but still the same key to a reader.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  auto norm = [](char c) { return c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (norm(a[i - 1]) == norm(b[j - 1]) ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known key closest to `key`, or "" when none is close enough to be a likely typo: at most
// max(1, length / 3) edits, or one key a prefix of the other ("timeout" for "timeout_ms"). Ties go to
// the first candidate in `known`'s order, so the suggestion is deterministic.
template <class Keys>
std::string nearest_key(const std::string& key, const Keys& known) {
  std::string best;
  size_t best_distance = static_cast<size_t>(-1);
  for (const std::string& candidate : known) {
    const size_t d = edit_distance(key, candidate);
    const size_t shorter = std::min(key.size(), candidate.size());
    const bool prefix = shorter >= 3 && edit_distance(key.substr(0, shorter), candidate.substr(0, shorter)) == 0;
    const bool close = d <= std::max<size_t>(1, std::max(key.size(), candidate.size()) / 3) || prefix;
    if (close && d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

// " (did you mean 'x'?)" for a message about the unknown `key`, or "" when nothing is close.
template <class Keys>
std::string did_you_mean(const std::string& key, const Keys& known) {
  const std::string nearest = nearest_key(key, known);
  return nearest.empty() ? std::string() : " (did you mean '" + nearest + "'?)";
}

}  // namespace cad::keys

// report.cpp -- the record of checks a conformance run made (see conformance.h).
#include "conformance.h"

namespace cad::conformance {

void Report::pass(const std::string& name, const std::string& detail) {
  checks.push_back(Check{name, true, detail, false});
}

void Report::fail(const std::string& name, const std::string& detail) {
  checks.push_back(Check{name, false, detail, false});
}

void Report::skip(const std::string& name, const std::string& reason) {
  checks.push_back(Check{name, true, "skipped: " + reason, true});
}

bool Report::expect(bool ok, const std::string& name, const std::string& detail_if_failed) {
  if (ok) {
    pass(name);
  } else {
    fail(name, detail_if_failed);
  }
  return ok;
}

int Report::failed() const {
  int n = 0;
  for (const Check& c : checks) n += c.passed ? 0 : 1;
  return n;
}

int Report::skipped() const {
  int n = 0;
  for (const Check& c : checks) n += c.skipped ? 1 : 0;
  return n;
}

int Report::passed() const {
  int n = 0;
  for (const Check& c : checks) n += (c.passed && !c.skipped) ? 1 : 0;
  return n;
}

}  // namespace cad::conformance

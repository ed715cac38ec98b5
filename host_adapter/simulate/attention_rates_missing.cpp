// attention_rates_missing.cpp -- built only while plugins/common/rate_table.{h,cpp} is absent from the
// tree: the measured table cannot be read, so only fixed rates (--attention-tflops) work.
#include <stdexcept>

#include "attention_rates.h"

namespace cad::simulate {

std::unique_ptr<AttentionRates> load_attention_rates(const std::string& path) {
  throw std::invalid_argument(path + ": this build has no rate-table reader (plugins/common/rate_table.cpp); "
                              "use --attention-tflops FWD,BWD");
}

}  // namespace cad::simulate

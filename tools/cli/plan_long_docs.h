// plan_long_docs.h -- `cad plan` on steps whose documents may be longer than one rank (--max-doc-len,
// --tokens-per-rank): the documents laid over the ranks whole (long_docs.h), every balancer run on the
// pieces, and per balancer max/mean, bytes moved and the memory each server must hold (server_memory.h).
// cmd_plan.cpp hands the command line here when it names either option.
#pragma once

namespace cad::cli {

// Whether the command line asks for the long-document mode (names --max-doc-len or --tokens-per-rank).
bool wants_long_docs(int argc, char** argv);
// The mode's part of `cad plan --help`.
const char* long_docs_usage();
// Runs `cad plan` in that mode; returns the exit code (1 when a balancer fails or a plan does not fit
// --memory-cap). Throws UsageError for a bad command line, std::runtime_error for a batch or a layout that
// cannot be planned (a layout no plan fits under --memory-cap names the document, the rank and the bytes).
int run_plan_long_docs(int argc, char** argv);

}  // namespace cad::cli

// loader_test.cpp -- cad_library_open refuses every broken plugin with its one-line reason (asserted
// word for word), loads a good one, and never leaves anything loaded on failure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#include <thread>

#include "adapter_test_support.h"
#include "cad_host.hpp"

namespace {

using cad::test::broken_plugin;

struct Refusal {
  const char* plugin;       // file name part: cad_<plugin>.so in the broken plugin directory
  cad_status_t status;
  const char* reason;       // what follows "plugin <path>: "
};

std::ostream& operator<<(std::ostream& os, const Refusal& r) { return os << r.plugin; }

class BrokenPlugin : public ::testing::TestWithParam<Refusal> {};

TEST_P(BrokenPlugin, IsRefusedWithItsOneLineReason) {
  const Refusal& r = GetParam();
  const std::string path = broken_plugin(r.plugin);
  cad_library_t* library = nullptr;
  char error[1024] = {0};
  EXPECT_EQ(cad_library_open(path.c_str(), nullptr, &library, error, sizeof error), r.status) << error;
  EXPECT_EQ(library, nullptr);
  EXPECT_EQ(std::string(error), "plugin " + path + ": " + r.reason);
  EXPECT_EQ(std::string(error).find('\n'), std::string::npos) << "one line";
}

const std::string kHelper = std::string(CAD_BROKEN_PLUGIN_DIR) + "/../libcad_broken_entry_helper.so";

INSTANTIATE_TEST_SUITE_P(
    Loader, BrokenPlugin,
    ::testing::Values(
        Refusal{"wrong_major", CAD_STATUS_ABI_MISMATCH,
                "built for plugin ABI 2, this host supports ABI 1 (it exports cad_plugin_entry_v2, not "
                "cad_plugin_entry_v1)"},
        Refusal{"table_major2", CAD_STATUS_ABI_MISMATCH, "built for plugin ABI 2, this host supports ABI 1"},
        Refusal{"no_entry", CAD_STATUS_ABI_MISMATCH,
                "no entry symbol cad_plugin_entry_v1 (not a CAD plugin, or built without CAD_PLUGIN_EXPORT)"},
        Refusal{"table_too_small", CAD_STATUS_ABI_MISMATCH, "plugin table is 24 bytes, ABI v1 needs at least 72"},
        Refusal{"null_function", CAD_STATUS_ABI_MISMATCH, "attention table: mandatory function 'forward' is NULL"},
        Refusal{"null_kind_table", CAD_STATUS_ABI_MISMATCH, "kind is attention but the attention table is NULL"},
        Refusal{"notelf", CAD_STATUS_ABI_MISMATCH, "not a shared object (no ELF header)"},
        Refusal{"undefined_symbol", CAD_STATUS_ABI_MISMATCH, "cannot load: undefined symbol: cad_missing_variable"},
        Refusal{"missing_file", CAD_STATUS_NOT_FOUND, "file not found"}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return std::string(info.param.plugin); });

TEST(Loader, RefusesAnEntrySymbolThatResolvesInADependency) {
  const std::string path = broken_plugin("entry_in_dependency");
  char error[1024] = {0};
  cad_library_t* library = nullptr;
  EXPECT_EQ(cad_library_open(path.c_str(), nullptr, &library, error, sizeof error), CAD_STATUS_ABI_MISMATCH);
  const std::string message = error;
  EXPECT_EQ(message.rfind("plugin " + path + ": entry symbol cad_plugin_entry_v1 resolves in ", 0), 0u) << message;
  EXPECT_NE(message.find("libcad_broken_entry_helper.so, not in the plugin itself"), std::string::npos) << message;
}

TEST(Loader, RefusesATruncatedFileNamingBothSizes) {
  const std::string path = broken_plugin("truncated");
  char error[1024] = {0};
  cad_library_t* library = nullptr;
  EXPECT_EQ(cad_library_open(path.c_str(), nullptr, &library, error, sizeof error), CAD_STATUS_ABI_MISMATCH);
  const std::string message = error;
  EXPECT_EQ(message.rfind("plugin " + path + ": truncated: the file has 1000 bytes, its ELF headers describe ", 0), 0u)
      << message;
}

TEST(Loader, RefusesAnExecutable) {
  // Any ELF executable will do; the test binary itself is one.
  char error[1024] = {0};
  cad_library_t* library = nullptr;
  EXPECT_NE(cad_library_open("/proc/self/exe", nullptr, &library, error, sizeof error), CAD_STATUS_OK);
  EXPECT_NE(std::string(error).find(": not a shared object: it is an executable"), std::string::npos) << error;
}

TEST(Loader, NameNotFoundListsTheDirectoriesSearched) {
  char error[2048] = {0};
  cad_library_t* library = nullptr;
  EXPECT_EQ(cad_library_open("no_such_plugin", "/nonexistent/a:/nonexistent/b", &library, error, sizeof error),
            CAD_STATUS_NOT_FOUND);
  const std::string message = error;
  EXPECT_EQ(message.rfind("plugin 'no_such_plugin': cad_no_such_plugin.so not found in /nonexistent/a:/nonexistent/b:", 0), 0u)
      << message;
}

TEST(Loader, OpensTheFixtureByNameAndByPath) {
  cad::Library by_name("test_attention", cad::test::fixture_dir().c_str());
  EXPECT_STREQ(by_name.plugin().name, "test_attention");
  EXPECT_EQ(by_name.plugin().kind, CAD_PLUGIN_KIND_ATTENTION);
  cad::Library by_path(cad::test::fixture_plugin());
  EXPECT_EQ(by_path.path(), by_name.path());
  EXPECT_EQ(&by_path.plugin(), &by_name.plugin()) << "one object, loaded once, reference counted";
}

TEST(Loader, SearchPathThenEnvironment) {
  ::setenv("CAD_PLUGIN_PATH", cad::test::fixture_dir().c_str(), 1);
  cad::Library library("test_attention");
  ::unsetenv("CAD_PLUGIN_PATH");
  EXPECT_STREQ(library.plugin().name, "test_attention");
}

TEST(Loader, WrapperThrowsErrorWithStatus) {
  try {
    cad::Library library(broken_plugin("notelf"));
    FAIL() << "no exception";
  } catch (const cad::Error& e) {
    EXPECT_EQ(e.status(), CAD_STATUS_ABI_MISMATCH);
    EXPECT_NE(std::string(e.what()).find("not a shared object"), std::string::npos);
  }
}

TEST(Loader, RepeatedOpenCloseOfGoodAndBrokenPlugins) {
  for (int i = 0; i < 50; ++i) {
    cad_library_t* library = nullptr;
    ASSERT_EQ(cad_library_open(cad::test::fixture_plugin().c_str(), nullptr, &library, nullptr, 0), CAD_STATUS_OK);
    cad_library_close(library);
    EXPECT_NE(cad_library_open(broken_plugin("table_major2").c_str(), nullptr, &library, nullptr, 0), CAD_STATUS_OK);
  }
}

TEST(Loader, ConcurrentOpenAndCloseFromSeveralThreads) {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < 25; ++i) {
        cad_library_t* library = nullptr;
        if (cad_library_open(cad::test::fixture_plugin().c_str(), nullptr, &library, nullptr, 0) != CAD_STATUS_OK ||
            std::string(cad_library_plugin(library)->name) != "test_attention") {
          ++failures[t];
        }
        cad_library_close(library);
        if (cad_library_open(broken_plugin("no_entry").c_str(), nullptr, &library, nullptr, 0) == CAD_STATUS_OK) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(Loader, NullArgumentsAreRefused) {
  char error[256] = {0};
  cad_library_t* library = nullptr;
  EXPECT_EQ(cad_library_open(nullptr, nullptr, &library, error, sizeof error), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(error, "cad_library_open: name_or_path is NULL");
  EXPECT_EQ(cad_library_open("x.so", nullptr, nullptr, error, sizeof error), CAD_STATUS_INVALID_ARGUMENT);
  cad_library_close(nullptr);
  EXPECT_EQ(cad_library_plugin(nullptr), nullptr);
}

TEST(Loader, ErrorBufferIsTruncatedAndTerminated) {
  char error[8];
  std::memset(error, 'x', sizeof error);
  cad_library_t* library = nullptr;
  EXPECT_NE(cad_library_open(broken_plugin("notelf").c_str(), nullptr, &library, error, sizeof error), CAD_STATUS_OK);
  EXPECT_STREQ(error, "plugin ");
}

TEST(Loader, ListsPluginFilesSortedByName) {
  char* joined = nullptr;
  ASSERT_EQ(cad_list_plugin_files(CAD_BROKEN_PLUGIN_DIR, &joined, nullptr, 0), CAD_STATUS_OK);
  const std::string paths = joined;
  cad_string_free(joined);
  const std::vector<std::string> expected = {"cad_create_fails.so", "cad_entry_in_dependency.so", "cad_no_entry.so",
                                             "cad_notelf.so", "cad_null_function.so", "cad_null_kind_table.so",
                                             "cad_table_major2.so", "cad_table_too_small.so", "cad_truncated.so",
                                             "cad_undefined_symbol.so", "cad_wrong_major.so"};
  size_t last = 0;
  for (const auto& name : expected) {
    const size_t at = paths.find("/" + name);
    ASSERT_NE(at, std::string::npos) << name << " missing from\n" << paths;
    EXPECT_GE(at, last) << name << " out of order";
    last = at;
  }
  EXPECT_EQ(paths.find("libcad_broken_entry_helper"), std::string::npos) << "only cad_*.so files are plugins";
}

}  // namespace

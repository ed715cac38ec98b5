// config_test.cpp -- the stack config's validation: every bad key, type or range is refused with a
// message naming the file and the key path; unknown keys only warn; paths resolve against the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "adapter_test_support.h"

namespace {

using cad::test::make_host;

struct BadConfig {
  const char* label;
  const char* json;
  const char* message;  // the whole error message
};

std::ostream& operator<<(std::ostream& os, const BadConfig& c) { return os << c.label; }

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, IsRefusedNamingFileAndKey) {
  const BadConfig& c = GetParam();
  cad::test::LogCapture log;
  const auto result = make_host(c.json, &log);
  EXPECT_EQ(result.status, CAD_STATUS_INVALID_CONFIG);
  EXPECT_EQ(result.host, nullptr);
  EXPECT_EQ(result.error, c.message);
}

// A valid instance entry, to embed in configs that are wrong elsewhere.
#define GOOD "{\"name\": \"a\", \"plugin\": \"" CAD_TEST_PLUGIN_DIR "/cad_test_attention.so\"}"

INSTANTIATE_TEST_SUITE_P(
    Config, BadConfigTest,
    ::testing::Values(
        BadConfig{"top_level_array", "[1, 2]", "bad.json: (top level): expected a JSON object, got [1,2]"},
        BadConfig{"log_level_type", "{\"log_level\": 3, \"instances\": [" GOOD "]}",
                  "bad.json: log_level: expected one of \"trace\", \"debug\", \"info\", \"warn\", \"error\", \"off\", "
                  "got 3"},
        BadConfig{"log_level_range", "{\"log_level\": \"loud\", \"instances\": [" GOOD "]}",
                  "bad.json: log_level: expected one of \"trace\", \"debug\", \"info\", \"warn\", \"error\", \"off\", "
                  "got \"loud\""},
        BadConfig{"plugin_path_type", "{\"plugin_path\": \"dir\", \"instances\": [" GOOD "]}",
                  "bad.json: plugin_path: expected an array of directory names, got \"dir\""},
        BadConfig{"plugin_path_entry", "{\"plugin_path\": [\"ok\", 1], \"instances\": [" GOOD "]}",
                  "bad.json: plugin_path[1]: expected a non-empty string, got 1"},
        BadConfig{"instances_missing", "{}", "bad.json: instances: missing (expected an array of instance objects)"},
        BadConfig{"instances_type", "{\"instances\": {}}",
                  "bad.json: instances: expected a non-empty array of instance objects, got {}"},
        BadConfig{"instances_empty", "{\"instances\": []}",
                  "bad.json: instances: expected a non-empty array of instance objects, got []"},
        BadConfig{"instance_type", "{\"instances\": [" GOOD ", 5]}",
                  "bad.json: instances[1]: expected an object {\"name\", \"plugin\", \"config\"}, got 5"},
        BadConfig{"name_missing", "{\"instances\": [{\"plugin\": \"x\"}]}",
                  "bad.json: instances[0].name: missing (expected a non-empty string)"},
        BadConfig{"name_empty", "{\"instances\": [{\"name\": \"\", \"plugin\": \"x\"}]}",
                  "bad.json: instances[0].name: expected a non-empty string, got \"\""},
        BadConfig{"plugin_missing", "{\"instances\": [{\"name\": \"b\"}]}",
                  "bad.json: instances[0].plugin: missing (expected a plugin name or path)"},
        BadConfig{"plugin_type",
                  "{\"instances\": [" GOOD ", {\"name\": \"b\", \"plugin\": \"x\"}, {\"name\": \"c\", \"plugin\": 42}]}",
                  "bad.json: instances[2].plugin: expected a non-empty string, got 42"},
        BadConfig{"config_type", "{\"instances\": [{\"name\": \"b\", \"plugin\": \"x\", \"config\": \"fast\"}]}",
                  "bad.json: instances[0].config: expected a JSON object, got \"fast\""},
        BadConfig{"duplicate_name", "{\"instances\": [" GOOD ", " GOOD "]}",
                  "bad.json: instances[1].name: duplicate instance name 'a'"},
        BadConfig{"attention_type", "{\"instances\": [" GOOD "], \"attention\": 7}",
                  "bad.json: attention: expected a non-empty string, got 7"},
        BadConfig{"attention_unknown", "{\"instances\": [" GOOD "], \"attention\": \"zz\"}",
                  "bad.json: attention: names no instance ('zz'; expected one of the instances' names)"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return std::string(info.param.label); });

// The one whose exact text comes from the JSON parser: check the prefix only.
TEST(Config, NotJsonNamesTheFile) {
  const auto result = make_host("{\"instances\": [");
  EXPECT_EQ(result.status, CAD_STATUS_INVALID_CONFIG);
  EXPECT_EQ(result.error.rfind("bad.json: not valid JSON: ", 0), 0u) << result.error;
}

TEST(Config, UnknownKeysWarnAndAreIgnored) {
  cad::test::LogCapture log;
  const auto result = make_host("{\"colour\": 1, \"instances\": [{\"name\": \"a\", \"plugin\": \"" CAD_TEST_PLUGIN_DIR
                                "/cad_test_attention.so\", \"extra\": true}]}",
                                &log);
  ASSERT_EQ(result.status, CAD_STATUS_OK) << result.error;
  EXPECT_TRUE(log.contains("3|host|bad.json: unknown key 'colour' ignored"));
  EXPECT_TRUE(log.contains("3|host|bad.json: instances[0]: unknown key 'extra' ignored"));
  cad_host_destroy(result.host);
}

TEST(Config, MissingFileIsNotFound) {
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_path = "/nonexistent/stack.json";
  cad_host_t* host = nullptr;
  char error[512] = {0};
  EXPECT_EQ(cad_host_create(&options, &host, error, sizeof error), CAD_STATUS_NOT_FOUND);
  EXPECT_STREQ(error, "config file /nonexistent/stack.json: cannot be read");
}

TEST(Config, PluginPathAndPluginFilesResolveAgainstTheConfigFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("cad_adapter_config_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string relative_dir = fs::relative(cad::test::fixture_dir(), dir).string();
  const fs::path file = dir / "stack.json";
  std::ofstream(file) << "{\"plugin_path\": [\"" << relative_dir << "\"], \"instances\": ["
                      << "{\"name\": \"by_name\", \"plugin\": \"test_attention\"},"
                      << "{\"name\": \"by_path\", \"plugin\": \"" << relative_dir << "/cad_test_attention.so\"}]}";
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  const std::string path = file.string();
  options.config_path = path.c_str();
  cad_host_t* host = nullptr;
  char error[1024] = {0};
  // Run from elsewhere: relative paths must not depend on the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path("/");
  const cad_status_t status = cad_host_create(&options, &host, error, sizeof error);
  fs::current_path(cwd);
  EXPECT_EQ(status, CAD_STATUS_OK) << error;
  EXPECT_EQ(cad_host_num_instances(host), 2);
  cad_host_destroy(host);
  fs::remove_all(dir);
}

TEST(Config, CreateFailurePassesThePluginsMessageOn) {
  const std::string path = cad::test::broken_plugin("create_fails");
  const auto result = make_host("{\"instances\": [{\"name\": \"x\", \"plugin\": \"" + path + "\"}]}");
  EXPECT_EQ(result.status, CAD_STATUS_INVALID_CONFIG);
  EXPECT_EQ(result.error, "bad.json: instances[0] ('x'): plugin " + path + ": create failed: broken on purpose");
}

TEST(Config, LoadFailureNamesTheInstanceAndFile) {
  const std::string path = cad::test::broken_plugin("table_major2");
  const auto result = make_host("{\"instances\": [" GOOD ", {\"name\": \"x\", \"plugin\": \"" + path + "\"}]}");
  EXPECT_EQ(result.status, CAD_STATUS_ABI_MISMATCH);
  EXPECT_EQ(result.error,
            "bad.json: instances[1] ('x'): plugin " + path + ": built for plugin ABI 2, this host supports ABI 1");
}

TEST(Config, UnknownPluginNameIsNotFound) {
  const auto result = make_host("{\"instances\": [{\"name\": \"x\", \"plugin\": \"no_such_plugin\"}]}", nullptr, "/nonexistent");
  EXPECT_EQ(result.status, CAD_STATUS_NOT_FOUND);
  EXPECT_EQ(result.error.rfind("bad.json: instances[0] ('x'): plugin 'no_such_plugin': cad_no_such_plugin.so not found in /nonexistent:", 0), 0u)
      << result.error;
}

TEST(Config, OptionsAreChecked) {
  cad_host_t* host = nullptr;
  char error[512] = {0};
  EXPECT_EQ(cad_host_create(nullptr, &host, error, sizeof error), CAD_STATUS_INVALID_ARGUMENT);
  cad_host_options_v1_t options{};
  options.struct_size = 8;
  EXPECT_EQ(cad_host_create(&options, &host, error, sizeof error), CAD_STATUS_ABI_MISMATCH);
  EXPECT_NE(std::string(error).find("options.struct_size is 8"), std::string::npos) << error;
  options.struct_size = sizeof options;
  EXPECT_EQ(cad_host_create(&options, &host, error, sizeof error), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(host, nullptr);
}

}  // namespace

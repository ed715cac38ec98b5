// host_test.cpp -- the configured stack: instance lookup (only earlier instances, right kind), the
// attention instance, reverse destroy order, log level from the environment, the memory service, the
// bootstrap pass-through, and that a failed create leaves nothing behind.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "adapter_test_support.h"
#include "cad_host.hpp"

namespace {

using cad::test::LogCapture;
using cad::test::make_host;

std::string instance(const std::string& name, const std::string& config = "{}") {
  return "{\"name\": \"" + name + "\", \"plugin\": \"" + cad::test::fixture_plugin() + "\", \"config\": " + config + "}";
}

TEST(Host, InstancesLookUpOnlyEarlierInstances) {
  // "b" needs "a", created before it: fine.
  auto ok = make_host("{\"instances\": [" + instance("a") + ", " + instance("b", "{\"needs\": \"a\"}") + "]}");
  ASSERT_EQ(ok.status, CAD_STATUS_OK) << ok.error;
  cad_host_destroy(ok.host);
  // "a" needs "b", created after it: refused, and the plugin's NOT_FOUND comes through.
  auto bad = make_host("{\"instances\": [" + instance("a", "{\"needs\": \"b\"}") + ", " + instance("b") + "]}");
  EXPECT_EQ(bad.status, CAD_STATUS_NOT_FOUND);
  EXPECT_NE(bad.error.find("instances[0] ('a'): plugin " + cad::test::fixture_plugin() +
                           ": create failed: needs attention instance 'b', which the host did not find"),
            std::string::npos)
      << bad.error;
}

TEST(Host, FindInstanceByNameAndKind) {
  auto r = make_host("{\"instances\": [" + instance("a") + ", " + instance("b") + "], \"attention\": \"b\"}");
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  const void* table = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  EXPECT_EQ(cad_host_find_instance(r.host, "a", CAD_PLUGIN_KIND_ATTENTION, &table, &a), CAD_STATUS_OK);
  EXPECT_EQ(cad_host_find_instance(r.host, "b", CAD_PLUGIN_KIND_ATTENTION, &table, &b), CAD_STATUS_OK);
  EXPECT_NE(a, b);
  EXPECT_EQ(cad_host_find_instance(r.host, "a", CAD_PLUGIN_KIND_BALANCER, &table, &a), CAD_STATUS_NOT_FOUND);
  EXPECT_EQ(cad_host_find_instance(r.host, "zz", CAD_PLUGIN_KIND_ATTENTION, &table, &a), CAD_STATUS_NOT_FOUND);
  // The host-wide services table sees every instance.
  const cad_host_services_v1_t* services = cad_host_services(r.host);
  void* found = nullptr;
  EXPECT_EQ(services->lookup_plugin(services->host_ctx, "b", CAD_PLUGIN_KIND_ATTENTION, &table, &found), CAD_STATUS_OK);
  EXPECT_EQ(found, b);
  EXPECT_EQ(services->lookup_plugin(services->host_ctx, "b", CAD_PLUGIN_KIND_COMMUNICATOR, &table, &found),
            CAD_STATUS_NOT_FOUND);
  const cad_attention_v1_t* attention = nullptr;
  void* attention_instance = nullptr;
  EXPECT_EQ(cad_host_attention(r.host, &attention, &attention_instance), CAD_STATUS_OK);
  EXPECT_EQ(attention_instance, b);
  EXPECT_EQ(static_cast<const void*>(attention), table);
  cad_host_instance_info_v1_t info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(cad_host_instance_info(r.host, 1, &info), CAD_STATUS_OK);
  EXPECT_STREQ(info.name, "b");
  EXPECT_STREQ(info.plugin->name, "test_attention");
  EXPECT_EQ(info.instance, b);
  EXPECT_EQ(cad_host_instance_info(r.host, 2, &info), CAD_STATUS_INVALID_ARGUMENT);
  cad_host_destroy(r.host);
}

TEST(Host, LookupChecksTheKind) {
  const std::string balancer = "{\"name\": \"bal\", \"plugin\": \"" + cad::test::fixture_dir() + "/cad_test_balancer.so\"}";
  auto r = make_host("{\"instances\": [" + balancer + ", " + instance("a") + "]}");
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  const void* table = nullptr;
  void* ctx = nullptr;
  ASSERT_EQ(cad_host_find_instance(r.host, "bal", CAD_PLUGIN_KIND_BALANCER, &table, &ctx), CAD_STATUS_OK);
  const auto* balancer_table = static_cast<const cad_balancer_v1_t*>(table);
  EXPECT_EQ(balancer_table->plan(ctx, nullptr, nullptr), CAD_STATUS_UNSUPPORTED);
  EXPECT_STREQ(balancer_table->last_error(ctx), "test_balancer plans nothing");
  EXPECT_EQ(cad_host_find_instance(r.host, "bal", CAD_PLUGIN_KIND_ATTENTION, &table, &ctx), CAD_STATUS_NOT_FOUND);
  cad_host_destroy(r.host);
  // An instance that needs an attention instance is not satisfied by a balancer of that name.
  auto wrong_kind = make_host("{\"instances\": [" + balancer + ", " + instance("a", "{\"needs\": \"bal\"}") + "]}");
  EXPECT_EQ(wrong_kind.status, CAD_STATUS_NOT_FOUND);
  // "attention" must name an attention instance.
  auto bad = make_host("{\"instances\": [" + balancer + "], \"attention\": \"bal\"}");
  EXPECT_EQ(bad.status, CAD_STATUS_INVALID_CONFIG);
  EXPECT_EQ(bad.error, "bad.json: attention: instance 'bal' is a balancer, expected an attention instance");
}

TEST(Host, NoAttentionKeyMeansNotFound) {
  auto r = make_host("{\"instances\": [" + instance("a") + "]}");
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  const cad_attention_v1_t* table = nullptr;
  void* ctx = nullptr;
  EXPECT_EQ(cad_host_attention(r.host, &table, &ctx), CAD_STATUS_NOT_FOUND);
  cad_host_destroy(r.host);
}

TEST(Host, DestroysInReverseCreationOrder) {
  LogCapture log;
  auto r = make_host("{\"instances\": [" + instance("a", "{\"tag\": \"A\"}") + ", " + instance("b", "{\"tag\": \"B\"}") +
                         ", " + instance("c", "{\"tag\": \"C\"}") + "]}",
                     &log);
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  EXPECT_LT(log.index_of("create A"), log.index_of("create B"));
  EXPECT_LT(log.index_of("create B"), log.index_of("create C"));
  cad_host_destroy(r.host);
  const int c = log.index_of("destroy C"), b = log.index_of("destroy B"), a = log.index_of("destroy A");
  ASSERT_GE(c, 0);
  EXPECT_LT(c, b);
  EXPECT_LT(b, a);
}

TEST(Host, FailedCreateDestroysWhatWasCreatedInReverse) {
  LogCapture log;
  const std::string broken = cad::test::broken_plugin("create_fails");
  auto r = make_host("{\"instances\": [" + instance("a", "{\"tag\": \"A\"}") + ", " + instance("b", "{\"tag\": \"B\"}") +
                         ", {\"name\": \"x\", \"plugin\": \"" + broken + "\"}]}",
                     &log);
  EXPECT_EQ(r.status, CAD_STATUS_INVALID_CONFIG);
  EXPECT_EQ(r.host, nullptr);
  ASSERT_GE(log.index_of("destroy B"), 0);
  EXPECT_LT(log.index_of("destroy B"), log.index_of("destroy A"));
}

TEST(Host, LogLevelFromConfigAndEnvironment) {
  const std::string json = "{\"log_level\": \"error\", \"instances\": [" + instance("a", "{\"tag\": \"A\"}") + "]}";
  {
    ::unsetenv("CAD_LOG_LEVEL");
    LogCapture log;
    auto r = make_host(json, &log);
    ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
    EXPECT_EQ(cad_host_log_level(r.host), CAD_LOG_ERROR);
    EXPECT_EQ(cad_host_services(r.host)->log_level, CAD_LOG_ERROR);
    EXPECT_FALSE(log.contains("create A")) << "info is below the config's level";
    cad_host_destroy(r.host);
  }
  {
    ::setenv("CAD_LOG_LEVEL", "debug", 1);  // the environment wins over the config
    LogCapture log;
    auto r = make_host(json, &log);
    ::unsetenv("CAD_LOG_LEVEL");
    ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
    EXPECT_EQ(cad_host_log_level(r.host), CAD_LOG_DEBUG);
    EXPECT_TRUE(log.contains("2|a|create A")) << "plugins log through the services, as their instance";
    EXPECT_TRUE(log.contains("1|host|created instance 'a' of plugin test_attention"));
    cad_host_destroy(r.host);
  }
  {
    ::setenv("CAD_LOG_LEVEL", "chatty", 1);  // unknown: warned about and ignored
    LogCapture log;
    auto r = make_host(json, &log);
    ::unsetenv("CAD_LOG_LEVEL");
    ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
    EXPECT_EQ(cad_host_log_level(r.host), CAD_LOG_ERROR);
    cad_host_destroy(r.host);
  }
}

TEST(Host, MemoryService) {
  auto r = make_host("{\"instances\": [" + instance("a") + "]}");
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  const cad_host_services_v1_t* s = cad_host_services(r.host);
  void* p = nullptr;
  ASSERT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, 1000, nullptr, &p), CAD_STATUS_OK);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  std::memset(p, 0xab, 1000);
  s->free(s->host_ctx, {CAD_DEVICE_CPU, 0}, p, nullptr);
  void* zero = reinterpret_cast<void*>(1);
  EXPECT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, 0, nullptr, &zero), CAD_STATUS_OK);
  EXPECT_EQ(zero, nullptr);
  void* gpu = nullptr;
  const cad_status_t cuda = s->allocate(s->host_ctx, {CAD_DEVICE_CUDA, 0}, 1000, nullptr, &gpu);
#ifndef CAD_TEST_WITH_CUDA
  EXPECT_EQ(cuda, CAD_STATUS_UNSUPPORTED) << "a CPU build refuses CUDA memory";
#else
  EXPECT_NE(cuda, CAD_STATUS_UNSUPPORTED) << "a CUDA build serves CUDA memory (DEVICE_ERROR without a GPU)";
  if (cuda == CAD_STATUS_OK) {
    EXPECT_NE(gpu, nullptr);
    s->free(s->host_ctx, {CAD_DEVICE_CUDA, 0}, gpu, nullptr);
  }
#endif
  int not_ours = 0;
  s->free(s->host_ctx, {CAD_DEVICE_CPU, 0}, &not_ours, nullptr);  // logged, ignored, no crash
  cad_host_destroy(r.host);
}

TEST(Host, ServicesAreThreadSafe) {
  LogCapture log;
  auto r = make_host("{\"log_level\": \"debug\", \"instances\": [" + instance("a") + "]}", &log);
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  const cad_host_services_v1_t* s = cad_host_services(r.host);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([s, t] {
      for (int i = 0; i < 200; ++i) {
        void* p = nullptr;
        if (s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, static_cast<size_t>(64 + i), nullptr, &p) == CAD_STATUS_OK) {
          static_cast<char*>(p)[0] = static_cast<char>(i);
          s->free(s->host_ctx, {CAD_DEVICE_CPU, 0}, p, nullptr);
        }
        const void* table = nullptr;
        void* ctx = nullptr;
        s->lookup_plugin(s->host_ctx, "a", CAD_PLUGIN_KIND_ATTENTION, &table, &ctx);
        if (i % 50 == 0) s->log(s->host_ctx, CAD_LOG_DEBUG, "thread", ("tick " + std::to_string(t)).c_str());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  cad_host_destroy(r.host);
  EXPECT_EQ(log.index_of("were not freed"), -1) << "every block was freed";
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(log.contains("1|thread|tick " + std::to_string(t)));
}

TEST(Host, LeakedPluginMemoryIsReportedAndFreed) {
  LogCapture log;
  auto r = make_host("{\"instances\": [" + instance("a", "{\"allocate_bytes\": 4096, \"leak\": true}") + ", " +
                         instance("b", "{\"allocate_bytes\": 512}") + "]}",
                     &log);
  ASSERT_EQ(r.status, CAD_STATUS_OK) << r.error;
  cad_host_destroy(r.host);
  EXPECT_TRUE(log.contains("3|host|1 allocation(s) of 4096 bytes were not freed by the plugins; freed now"));
}

cad_status_t fake_all_gather(void* user, const void* send, size_t bytes, void* recv) {
  // Two "ranks": this one, and a peer whose contribution is the bitwise complement.
  *static_cast<int*>(user) += 1;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  for (size_t i = 0; i < bytes; ++i) {
    out[i] = in[i];
    out[bytes + i] = static_cast<unsigned char>(~in[i]);
  }
  return CAD_STATUS_OK;
}

TEST(Host, BootstrapAllGatherIsLentOnlyWhenGiven) {
  const std::string json = "{\"instances\": [" + instance("a") + "]}";
  auto without = make_host(json);
  ASSERT_EQ(without.status, CAD_STATUS_OK);
  EXPECT_EQ(cad_host_services(without.host)->bootstrap_all_gather, nullptr);
  EXPECT_EQ(cad_host_services(without.host)->bootstrap_rank, -1);
  cad_host_destroy(without.host);

  int calls = 0;
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_json = json.c_str();
  options.bootstrap_all_gather = &fake_all_gather;
  options.bootstrap_user = &calls;
  options.bootstrap_rank = 0;
  options.bootstrap_world_size = 2;
  cad::Host host(options);
  const cad_host_services_v1_t& s = host.services();
  EXPECT_EQ(s.bootstrap_rank, 0);
  EXPECT_EQ(s.bootstrap_world_size, 2);
  const unsigned char send[3] = {1, 2, 3};
  unsigned char recv[6] = {0};
  ASSERT_NE(s.bootstrap_all_gather, nullptr);
  EXPECT_EQ(s.bootstrap_all_gather(s.host_ctx, send, 3, recv), CAD_STATUS_OK);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(recv[2], 3);
  EXPECT_EQ(recv[5], static_cast<unsigned char>(~3));
}

TEST(Host, ForwardThroughTheWrapper) {
  const std::string json = "{\"instances\": [" + instance("a") + "], \"attention\": \"a\"}";
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_json = json.c_str();
  cad::Host host(options);
  const auto [table, ctx] = host.attention();
  float q[2 * 1 * 4] = {1, 2, 3, 4, 5, 6, 7, 8};
  float o[8] = {0};
  float lse[2] = {9, 9};
  int64_t q_shape[3] = {2, 1, 4}, lse_shape[2] = {1, 2};
  cad_tensor_v1_t tq{q, {CAD_DEVICE_CPU, 0}, 3, {CAD_DTYPE_CODE_FLOAT, 32, 1}, q_shape, nullptr, 0};
  cad_tensor_v1_t to{o, {CAD_DEVICE_CPU, 0}, 3, {CAD_DTYPE_CODE_FLOAT, 32, 1}, q_shape, nullptr, 0};
  cad_tensor_v1_t tl{lse, {CAD_DEVICE_CPU, 0}, 2, {CAD_DTYPE_CODE_FLOAT, 32, 1}, lse_shape, nullptr, 0};
  cad_attention_forward_args_v1_t args{};
  args.struct_size = sizeof args;
  args.q = &tq;
  args.k = &tq;
  args.v = &tq;
  args.o = &to;
  args.lse = &tl;
  ASSERT_EQ(table->forward(ctx, &args), CAD_STATUS_OK) << table->last_error(ctx);
  EXPECT_EQ(o[7], 8.0f);
  EXPECT_EQ(lse[1], 0.0f);
  EXPECT_THROW(host.find<cad_balancer_v1_t>("a", CAD_PLUGIN_KIND_BALANCER), cad::Error);
}

TEST(Host, NamesOfLevelsKindsAndStatuses) {
  cad_log_level_t level = CAD_LOG_OFF;
  EXPECT_EQ(cad_log_level_from_name("warn", &level), 0);
  EXPECT_EQ(level, CAD_LOG_WARN);
  EXPECT_EQ(cad_log_level_from_name("loud", &level), -1);
  EXPECT_STREQ(cad_plugin_kind_name(CAD_PLUGIN_KIND_BALANCER), "balancer");
  EXPECT_STREQ(cad_status_name(CAD_STATUS_ABI_MISMATCH), "ABI_MISMATCH");
  EXPECT_STREQ(cad_status_name(99), "UNKNOWN_STATUS");
}

}  // namespace

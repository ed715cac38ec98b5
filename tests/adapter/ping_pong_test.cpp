// ping_pong_test.cpp -- the ping-pong helper's enqueue order (what every rank must issue identically).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cad/ping_pong.hpp"

TEST(PingPong, EnqueuesEachNanoBatchAttentionBeforeTheOtherCompute) {
  std::vector<std::string> order;
  int a = 0, b = 0;
  auto record = [&](const char* what) {
    return [&order, what](int nano, int layer, void* stream) {
      order.push_back(std::string(what) + (nano == 0 ? "A" : "B") + std::to_string(layer) +
                      (stream == nullptr ? "?" : ""));
    };
  };
  cad::NanoBatchCallbacks cb{record("pre"), record("attn"), record("post")};
  cad::run_ping_pong(2, cb, &a, &b);
  const std::vector<std::string> want = {"preA0", "attnA0", "preB0", "attnB0", "postA0", "postB0",
                                         "preA1", "attnA1", "preB1", "attnB1", "postA1", "postB1"};
  EXPECT_EQ(order, want);
  order.clear();
  cad::run_ping_pong(2, cb, &a, &b, /*reverse=*/true);
  EXPECT_EQ(order.front(), "preA1");
  EXPECT_EQ(order.back(), "postB0");
}

TEST(PingPong, StreamsGoToTheirNanoBatch) {
  int a = 0, b = 0;
  std::vector<void*> seen[2];
  auto note = [&](int nano, int, void* stream) { seen[nano].push_back(stream); };
  cad::run_ping_pong(3, {note, note, note}, &a, &b);
  for (void* s : seen[0]) EXPECT_EQ(s, &a);
  for (void* s : seen[1]) EXPECT_EQ(s, &b);
  EXPECT_EQ(seen[0].size(), 9u);
}

TEST(PingPong, RefusesMissingCallbacks) {
  cad::NanoBatchCallbacks cb;
  EXPECT_THROW(cad::run_ping_pong(1, cb, nullptr, nullptr), std::invalid_argument);
}

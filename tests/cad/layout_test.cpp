// layout_test.cpp -- single-process tests of the CAD plugin's pure parts: the dispatch layout (checked
// against the invariants a server batch must satisfy, on random batches and random plans), the
// exchange's pack/unpack (simulating every rank in one process), and the validation messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "call_check.h"
#include "exchange.h"
#include "layout.h"
#include "wire_tables.h"
#include "plugin_support.h"
#include "test_batch.h"
#include "validate.h"

namespace cp = cad::cad_plugin;
using cad_test::BatchSpec;
using cad_test::GlobalBatch;

namespace {

// A mock balancer: every document cut at random points, each cut on a random server.
std::vector<cad_task_v1_t> random_plan(const GlobalBatch& b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<cad_task_v1_t> tasks;
  for (const auto& doc : b.docs) {
    std::vector<int64_t> cuts = {0, doc.len};
    for (int i = 0; i < 3 && doc.len > 1; ++i) cuts.push_back(1 + static_cast<int64_t>(rng() % (doc.len - 1)));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      tasks.push_back(cad_task_v1_t{doc.id, cuts[i], cuts[i + 1], static_cast<int32_t>(rng() % b.world), 0});
    }
  }
  return tasks;
}

struct Token {
  int64_t doc;
  int64_t pos;
  bool operator<(const Token& o) const { return doc != o.doc ? doc < o.doc : pos < o.pos; }
  bool operator==(const Token& o) const { return doc == o.doc && pos == o.pos; }
};

// Which token each local row of each rank is.
std::vector<std::vector<Token>> owner_tokens(const GlobalBatch& b) {
  std::vector<std::vector<Token>> out(static_cast<size_t>(b.world));
  for (int32_t r = 0; r < b.world; ++r) {
    for (const auto& p : b.pieces[static_cast<size_t>(r)]) {
      for (int64_t i = 0; i < p.len; ++i) out[static_cast<size_t>(r)].push_back(Token{p.doc_id, p.offset_in_doc + i});
    }
  }
  return out;
}

// Every invariant a correct layout has, checked by following the runs back to document tokens.
// window_left >= 0 (causal): a segment's K/V rows are the document's keys [kv_lo, q_end) with kv_lo at
// most q_begin - window_left (clamped at 0), and its queries still stand at their document positions.
void expect_layout_invariants(const GlobalBatch& b, const std::vector<cad_task_v1_t>& tasks, bool causal,
                              int64_t window_left = -1) {
  const cp::Layout layout = cp::build_layout(b.pieces, tasks, causal, window_left);
  const auto tokens = owner_tokens(b);
  std::set<Token> queried;  // every token must be a query exactly once, across all servers
  for (int32_t s = 0; s < b.world; ++s) {
    const cp::ServerBatch& batch = layout.servers[static_cast<size_t>(s)];
    std::vector<Token> q_rows(static_cast<size_t>(batch.q_rows), Token{-1, -1});
    std::vector<Token> kv_rows(static_cast<size_t>(batch.kv_rows), Token{-1, -1});
    for (int32_t o = 0; o < b.world; ++o) {
      const cp::Route& route = layout.route(o, s);
      EXPECT_EQ(route.q_rows, cp::rows_in(route.q));
      EXPECT_EQ(route.kv_rows, cp::rows_in(route.kv));
      for (const auto& [runs, rows] : {std::pair{&route.q, &q_rows}, std::pair{&route.kv, &kv_rows}}) {
        for (const cp::RowRun& run : *runs) {
          for (int64_t i = 0; i < run.count; ++i) {
            Token& slot = (*rows)[static_cast<size_t>(run.dst_row + i)];
            EXPECT_EQ(slot.doc, -1) << "server " << s << " row " << run.dst_row + i << " written twice";
            slot = tokens[static_cast<size_t>(o)][static_cast<size_t>(run.src_row + i)];
          }
        }
      }
    }
    std::set<Token> kv_seen;  // deduplicated: no token's K/V twice on one server
    for (const Token& t : kv_rows) {
      EXPECT_NE(t.doc, -1) << "server " << s << ": a K/V row nobody sends";
      EXPECT_TRUE(kv_seen.insert(t).second) << "server " << s << " receives K/V of doc " << t.doc << " pos " << t.pos
                                            << " twice";
    }
    int64_t covered = 0;
    for (const cad_segment_v1_t& seg : batch.segments) {
      EXPECT_EQ(seg.q_offset, covered);  // segments tile the server's Q rows in order
      covered += seg.q_len;
      const Token first_q = q_rows[static_cast<size_t>(seg.q_offset)];
      const int64_t doc_len = b.doc(first_q.doc).len;
      // The first key of the range: 0 without a window, else at most where the first query's window starts.
      const int64_t kv_lo = seg.kv_len > 0 ? kv_rows[static_cast<size_t>(seg.kv_offset)].pos : 0;
      if (window_left < 0) EXPECT_EQ(kv_lo, 0);
      else EXPECT_LE(kv_lo, std::max<int64_t>(0, first_q.pos - window_left));
      EXPECT_EQ(seg.kv_len, causal ? first_q.pos + seg.q_len - kv_lo : doc_len);
      for (int64_t j = 0; j < seg.kv_len; ++j) {  // the KV range is the document's keys [kv_lo, ...), in order
        EXPECT_TRUE((kv_rows[static_cast<size_t>(seg.kv_offset + j)] == Token{first_q.doc, kv_lo + j}));
      }
      for (int64_t i = 0; i < seg.q_len; ++i) {  // bottom-right alignment puts query i at kv_len - q_len + i
        const Token t = q_rows[static_cast<size_t>(seg.q_offset + i)];
        EXPECT_TRUE((t == Token{first_q.doc,
                                (causal ? kv_lo + seg.kv_len : first_q.pos + seg.q_len) - seg.q_len + i}));
        EXPECT_TRUE(queried.insert(t).second) << "doc " << t.doc << " pos " << t.pos << " queried twice";
      }
    }
    EXPECT_EQ(covered, batch.q_rows);
  }
  EXPECT_EQ(static_cast<int64_t>(queried.size()), b.total_tokens);
}

}  // namespace

TEST(Layout, InvariantsHoldOnRandomBatchesAndPlans) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    BatchSpec spec;
    spec.seed = seed;
    spec.world = static_cast<int32_t>(1 + seed % 6);
    spec.tokens_per_rank = 60;
    const GlobalBatch b = cad_test::make_batch(spec);
    cp::check_piece_tables(b.pieces);
    const auto tasks = random_plan(b, seed);
    cp::check_plan(b.pieces, tasks, b.world, "mock");
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_layout_invariants(b, tasks, true);
    expect_layout_invariants(b, tasks, false);
    for (int64_t left : {0, 4, 25}) expect_layout_invariants(b, tasks, true, left);
  }
}

TEST(Layout, AWindowTrimsTheSharedKvCopy) {
  // Document 7 (len 10) split 6 + 4 over ranks 0 and 1; tasks [0,3) and [8,10) on server 1, [3,8) on 0;
  // window 2: server 1 needs keys [0, 3) and [6, 10), one copy of their hull [0, 10); server 0 [1, 8).
  const cp::PieceTables tables = {{{7, 10, 0, 6}}, {{7, 10, 6, 4}}};
  const std::vector<cad_task_v1_t> tasks = {{7, 0, 3, 1, 0}, {7, 3, 8, 0, 0}, {7, 8, 10, 1, 0}};
  const cp::Layout layout = cp::build_layout(tables, tasks, true, 2);
  const cp::ServerBatch& s0 = layout.servers[0];
  EXPECT_EQ(s0.kv_rows, 7);
  ASSERT_EQ(s0.segments.size(), 2u);  // [3, 6) from rank 0's piece and [6, 8) from rank 1's
  EXPECT_EQ(s0.segments[0].kv_len, 6 - 1);
  EXPECT_EQ(s0.segments[1].kv_len, 8 - 1);
  EXPECT_EQ(layout.route(0, 0).kv_rows, 5);  // keys [1, 6) of its own piece
  EXPECT_EQ(layout.route(1, 0).kv_rows, 2);  // keys [6, 8) from rank 1
  EXPECT_EQ(layout.servers[1].kv_rows, 10);
}

TEST(Layout, SharesOneKvPrefixPerDocumentAndServer) {
  // Document 7 (len 10) split 6 + 4 over ranks 0 and 1; tasks [0,3) and [8,10) on server 1, [3,8) on 0.
  const cp::PieceTables tables = {{{7, 10, 0, 6}}, {{7, 10, 6, 4}}};
  const std::vector<cad_task_v1_t> tasks = {{7, 0, 3, 1, 0}, {7, 3, 8, 0, 0}, {7, 8, 10, 1, 0}};
  const cp::Layout layout = cp::build_layout(tables, tasks, true);
  const cp::ServerBatch& s1 = layout.servers[1];
  EXPECT_EQ(s1.q_rows, 5);
  EXPECT_EQ(s1.kv_rows, 10);  // one prefix [0, 10) for both tasks, not 3 + 10
  ASSERT_EQ(s1.segments.size(), 2u);
  EXPECT_EQ(s1.segments[0].kv_offset, s1.segments[1].kv_offset);
  EXPECT_EQ(s1.segments[0].kv_len, 3);
  EXPECT_EQ(s1.segments[1].kv_len, 10);
  // Server 0 needs the prefix [0, 8): 6 rows from rank 0 (its own) and 2 from rank 1.
  EXPECT_EQ(layout.route(0, 0).kv_rows, 6);
  EXPECT_EQ(layout.route(1, 0).kv_rows, 2);
  ASSERT_EQ(layout.servers[0].segments.size(), 2u);  // queries [3,8) live on two ranks: two segments
  EXPECT_EQ(layout.servers[0].segments[0].q_len, 3);
  EXPECT_EQ(layout.servers[0].segments[0].kv_len, 6);
  EXPECT_EQ(layout.servers[0].segments[1].q_len, 2);
  EXPECT_EQ(layout.servers[0].segments[1].kv_len, 8);
}

TEST(Exchange, SimulatedRanksRoundTripRowsLseAndSums) {
  BatchSpec spec;
  spec.seed = 7;
  spec.world = 4;
  spec.tokens_per_rank = 50;
  const GlobalBatch b = cad_test::make_batch(spec);
  const auto tasks = random_plan(b, 99);
  const cp::Layout layout = cp::build_layout(b.pieces, tasks, true);
  const int64_t width = 3, heads = 2, row_bytes = width * 4;
  const size_t world = static_cast<size_t>(b.world);

  // Owner r's row i carries the value 1000 * r + i in every column; LSE column i is -(1000 r + i) - h.
  std::vector<std::vector<float>> owner_q(world), owner_lse(world), back_q(world), back_lse(world), sums(world);
  std::vector<int64_t> tokens(world);
  for (size_t r = 0; r < world; ++r) {
    for (const auto& p : b.pieces[r]) tokens[r] += p.len;
    for (int64_t i = 0; i < tokens[r]; ++i) {
      for (int64_t c = 0; c < width; ++c) owner_q[r].push_back(static_cast<float>(1000 * r + i));
    }
    owner_lse[r].resize(static_cast<size_t>(heads * tokens[r]));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < tokens[r]; ++i) owner_lse[r][static_cast<size_t>(h * tokens[r] + i)] = -static_cast<float>(1000 * r + i) - h;
    }
    back_q[r].assign(owner_q[r].size(), 0.0f);
    back_lse[r].assign(owner_lse[r].size(), 0.0f);
    sums[r].assign(owner_q[r].size(), 0.0f);
  }
  std::vector<std::vector<float>> server_q(world), server_lse(world), ones(world);
  for (size_t s = 0; s < world; ++s) {
    server_q[s].assign(static_cast<size_t>(layout.servers[s].q_rows * width), 0.0f);
    server_lse[s].assign(static_cast<size_t>(layout.servers[s].q_rows * heads), 0.0f);
    ones[s].assign(static_cast<size_t>(layout.servers[s].kv_rows * width), 1.0f);
  }
  const auto as_bytes = [](std::vector<float>& v) { return reinterpret_cast<std::byte*>(v.data()); };
  const auto rows = [&](cp::RunSet set, std::vector<float>& v) {
    cp::Part p;
    p.runs = set;
    p.data = as_bytes(v);
    p.row_bytes = row_bytes;
    return p;
  };
  const auto lse = [&](std::vector<float>& v, int64_t n) {
    cp::Part p;
    p.runs = cp::RunSet::Q;
    p.format = cp::Format::LseColumns;
    p.data = as_bytes(v);
    p.row_bytes = heads * 4;
    p.lse_heads = heads;
    p.lse_rows = n;
    return p;
  };
  // A simulated all_to_all_v: pack on every rank, move the chunks, unpack on every rank.
  const auto simulate = [&](cp::Direction dir, const std::vector<std::vector<cp::Part>>& send,
                            const std::vector<std::vector<cp::Part>>& recv) {
    std::vector<cp::Transfer> t(world);
    std::vector<std::vector<std::byte>> sbuf(world), rbuf(world);
    for (size_t r = 0; r < world; ++r) {
      t[r] = cp::plan_transfer(layout, static_cast<int32_t>(r), dir, send[r], recv[r]);
      sbuf[r].resize(t[r].send_bytes);
      rbuf[r].resize(t[r].recv_bytes);
      cp::pack(layout, static_cast<int32_t>(r), dir, send[r], t[r], sbuf[r].data());
    }
    for (size_t from = 0; from < world; ++from) {
      for (size_t to = 0; to < world; ++to) {
        ASSERT_EQ(t[from].send_counts[to], t[to].recv_counts[from]);
        if (t[from].send_counts[to] == 0) continue;
        std::memcpy(rbuf[to].data() + t[to].recv_displs[from], sbuf[from].data() + t[from].send_displs[to],
                    t[from].send_counts[to]);
      }
    }
    for (size_t r = 0; r < world; ++r) cp::unpack(layout, static_cast<int32_t>(r), dir, recv[r], t[r], rbuf[r].data());
  };
  std::vector<std::vector<cp::Part>> send(world), recv(world);
  for (size_t r = 0; r < world; ++r) {
    send[r] = {rows(cp::RunSet::Q, owner_q[r]), lse(owner_lse[r], tokens[r])};
    recv[r] = {rows(cp::RunSet::Q, server_q[r]), lse(server_lse[r], layout.servers[r].q_rows)};
  }
  simulate(cp::Direction::ToServers, send, recv);
  for (size_t r = 0; r < world; ++r) {
    cp::Part acc = rows(cp::RunSet::KV, sums[r]);
    acc.format = cp::Format::AccumulateRows;
    send[r] = {rows(cp::RunSet::Q, server_q[r]), lse(server_lse[r], layout.servers[r].q_rows), rows(cp::RunSet::KV, ones[r])};
    recv[r] = {rows(cp::RunSet::Q, back_q[r]), lse(back_lse[r], tokens[r]), acc};
  }
  simulate(cp::Direction::ToOwners, send, recv);
  for (size_t r = 0; r < world; ++r) {
    EXPECT_EQ(back_q[r], owner_q[r]) << "rank " << r;
    EXPECT_EQ(back_lse[r], owner_lse[r]) << "rank " << r;
  }
  // Each K/V row comes back summed once per server that needed it: compare with a direct count.
  std::map<std::pair<int64_t, int64_t>, float> users;  // (doc, pos) -> servers whose prefix holds it
  std::map<std::pair<int64_t, int32_t>, int64_t> need;   // (doc, server) -> prefix length
  for (const auto& t : tasks) {
    int64_t& n = need[{t.doc_id, t.server}];
    n = std::max(n, t.q_end);
  }
  for (const auto& [key, len] : need) {
    for (int64_t pos = 0; pos < len; ++pos) users[{key.first, pos}] += 1.0f;
  }
  for (size_t r = 0; r < world; ++r) {
    int64_t row = 0;
    for (const auto& p : b.pieces[r]) {
      for (int64_t i = 0; i < p.len; ++i, ++row) {
        EXPECT_EQ(sums[r][static_cast<size_t>(row * width)], (users[{p.doc_id, p.offset_in_doc + i}]));
      }
    }
  }
}

TEST(Exchange, Bf16RoundsToNearestEven) {
  EXPECT_EQ(cp::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(cp::bf16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(cp::float_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(cp::float_to_bf16(1.01171875f), 0x3f82);  // 1 + 3*2^-8: halfway, even is 0x3f82
}

namespace {
std::string failure_of(const cp::PieceTables& tables) {
  try {
    cp::check_piece_tables(tables);
  } catch (const cad::plugin::Failure& f) {
    EXPECT_EQ(f.status(), CAD_STATUS_INVALID_ARGUMENT);
    return f.what();
  }
  return "";
}
}  // namespace

TEST(Validate, PieceTablesNameTheProblem) {
  EXPECT_EQ(failure_of({{{1, 5, 0, 3}}, {{1, 5, 3, 2}}}), "");
  EXPECT_EQ(failure_of({{{1, 5, 0, 3}}, {{1, 5, 2, 3}}}),
            "document 1: tokens [2, 3) are held twice, by rank 0 piece 0 and rank 1 piece 0");
  EXPECT_EQ(failure_of({{{1, 5, 0, 2}}, {{1, 5, 3, 2}}}), "document 1 (doc_len 5): tokens [2, 3) are held by no rank");
  EXPECT_EQ(failure_of({{{1, 5, 0, 3}}, {}}), "document 1 (doc_len 5): tokens [3, 5) are held by no rank");
  EXPECT_EQ(failure_of({{{1, 5, 0, 3}}, {{1, 6, 3, 2}}}),
            "document 1: rank 0 piece 0 says doc_len 5 but rank 1 piece 0 says 6");
  EXPECT_NE(failure_of({{{1, 5, 0, 0}}}).find("rank 0 piece 0 (doc 1)"), std::string::npos);
}

TEST(Validate, BrokenPlansAreInternalErrorsNamingTheBalancer) {
  const cp::PieceTables tables = {{{1, 5, 0, 5}}};
  try {
    cp::check_plan(tables, {{1, 0, 3, 0, 0}}, 1, "mine");
    FAIL() << "a plan that leaves queries [3, 5) uncovered was accepted";
  } catch (const cad::plugin::Failure& f) {
    EXPECT_EQ(f.status(), CAD_STATUS_INTERNAL);
    EXPECT_NE(std::string(f.what()).find("balancer instance 'mine'"), std::string::npos) << f.what();
  }
  EXPECT_THROW(cp::check_plan(tables, {{1, 0, 5, 1, 0}}, 1, "mine"), cad::plugin::Failure);  // no server 1
  EXPECT_THROW(cp::check_plan(tables, {{1, 0, 3, 0, 0}, {1, 2, 5, 0, 0}}, 1, "mine"), cad::plugin::Failure);
}

TEST(WireTables, GatherAndScatterAreInversesAndCoverEveryRowOnce) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    BatchSpec spec;
    spec.seed = seed;
    spec.world = 1 + static_cast<int32_t>(seed % 5);
    const GlobalBatch b = cad_test::make_batch(spec);
    const auto tasks = random_plan(b, seed);
    const cp::Layout layout = cp::build_layout(b.pieces, tasks, true);
    for (int32_t me = 0; me < b.world; ++me) {
      for (bool owner : {true, false}) {
        for (bool q : {true, false}) {
          const cp::WireTable t = cp::build_wire_table(layout, me, owner, q);
          ASSERT_EQ(t.to_wire.size(), t.from_wire.size());
          ASSERT_EQ(t.peer_first.size(), static_cast<size_t>(b.world) + 1);
          int64_t wire = 0;
          std::vector<int> seen;
          for (size_t i = 0; i < t.to_wire.size(); ++i) {
            const cp::WireCopy& g = t.to_wire[i];
            const cp::WireCopy& s = t.from_wire[i];
            EXPECT_EQ(g.dst_row, wire) << "wire rows are dense, peer after peer";
            EXPECT_EQ(s.src_row, g.dst_row);
            EXPECT_EQ(s.dst_row, g.src_row);
            EXPECT_EQ(s.num_rows, g.num_rows);
            wire += g.num_rows;
            for (int64_t r = g.src_row; r < g.src_row + g.num_rows; ++r) {
              if (static_cast<int64_t>(seen.size()) <= r) seen.resize(static_cast<size_t>(r) + 1, 0);
              ++seen[static_cast<size_t>(r)];
            }
          }
          EXPECT_EQ(wire, t.rows());
          const cp::ServerBatch& batch = layout.servers[static_cast<size_t>(me)];
          if (!owner) {
            // The server side receives every row of its batch exactly once.
            EXPECT_EQ(wire, q ? batch.q_rows : batch.kv_rows);
            for (int c : seen) EXPECT_EQ(c, 1);
          } else if (q) {
            // Every query row of the owner goes to exactly one server.
            EXPECT_EQ(wire, static_cast<int64_t>(b.global_rows(me).size()));
            for (int c : seen) EXPECT_EQ(c, 1);
          }
        }
      }
    }
  }
}

TEST(WireTables, ServerBatchIsInWireOrderForSequentialPacking) {
  // Documents packed rank after rank, ids rising: every server's batch already lies in wire order, so the
  // CUDA path receives Q/K/V in place (no scatter).
  const cp::PieceTables tables = {{{0, 5, 0, 5}, {1, 9, 0, 3}}, {{1, 9, 3, 6}, {2, 4, 0, 4}}};
  const std::vector<cad_task_v1_t> tasks = {{0, 0, 5, 1, 0}, {1, 0, 4, 0, 0}, {1, 4, 9, 1, 0}, {2, 0, 4, 0, 0}};
  const cp::Layout layout = cp::build_layout(tables, tasks, true);
  for (int32_t me = 0; me < 2; ++me) {
    EXPECT_TRUE(cp::build_wire_table(layout, me, false, true).identity) << "server " << me << " Q";
    EXPECT_TRUE(cp::build_wire_table(layout, me, false, false).identity) << "server " << me << " KV";
  }
}

bool same_segments(const std::vector<cad_segment_v1_t>& got, const std::vector<cad_segment_v1_t>& want) {
  return got.size() == want.size() &&
         std::equal(got.begin(), got.end(), want.begin(), [](const cad_segment_v1_t& a, const cad_segment_v1_t& b) {
           return a.q_offset == b.q_offset && a.q_len == b.q_len && a.kv_offset == b.kv_offset && a.kv_len == b.kv_len;
         });
}

TEST(Layout, TasksOnDocumentsTheServerHoldsWholeRunInPlace) {
  // Rank 0 holds document 0 whole (rows 0-5) and document 1's head (rows 6-8); rank 1 document 1's tail (rows
  // 0-1) and document 2 whole (rows 2-5).
  const cp::PieceTables tables = {{{0, 6, 0, 6}, {1, 5, 0, 3}}, {{1, 5, 3, 2}, {2, 4, 0, 4}}};
  const std::vector<cad_task_v1_t> tasks = {
      {0, 0, 4, 0, 0}, {0, 4, 6, 1, 0}, {1, 0, 5, 0, 0}, {2, 0, 2, 1, 0}, {2, 2, 4, 1, 0}, {2, 4, 4, 0, 0}};
  const cp::Layout off = cp::build_layout(tables, tasks, true);
  EXPECT_TRUE(off.own[0].segments.empty() && off.own[1].segments.empty());
  const cp::Layout layout = cp::build_layout(tables, tasks, true, -1, true);
  // Document 0's head stays on rank 0 and reads its prefix where it lies; document 2's two tasks stay on rank 1
  // (the empty task makes no segment); document 1 is split over the ranks, so it is routed as before.
  EXPECT_TRUE(same_segments(layout.own[0].segments, {{0, 4, 0, 4}}));
  EXPECT_TRUE(same_segments(layout.own[1].segments, {{2, 2, 2, 2}, {4, 2, 2, 4}}));
  EXPECT_EQ(layout.own[0].q_rows, 9);
  EXPECT_EQ(layout.own[1].kv_rows, 6);
  // What moves: document 0's tail (2 queries, its 6-key prefix) to server 1; document 1's tail to server 0.
  EXPECT_EQ(layout.route(0, 1).q_rows, 2);
  EXPECT_EQ(layout.route(0, 1).kv_rows, 6);
  EXPECT_EQ(layout.route(1, 0).q_rows, 2);
  EXPECT_EQ(layout.route(1, 1).q_rows, 0);  // rank 1 sends itself nothing
  EXPECT_EQ(layout.servers[0].q_rows, 5);
  EXPECT_EQ(layout.servers[1].q_rows, 2);
  EXPECT_EQ(layout.servers[0].q_rows + layout.servers[1].q_rows + 4 + 4, off.servers[0].q_rows + off.servers[1].q_rows);
  // A window of 1 key to the left: document 2's second task reads keys [1, 4); non-causal: the whole document.
  const cp::Layout windowed = cp::build_layout(tables, tasks, true, 1, true);
  EXPECT_TRUE(same_segments(windowed.own[1].segments, {{2, 2, 2, 2}, {4, 2, 3, 3}}));
  const cp::Layout full = cp::build_layout(tables, tasks, false, -1, true);
  EXPECT_TRUE(same_segments(full.own[1].segments, {{2, 2, 2, 4}, {4, 2, 2, 4}}));
  // Their dK/dV: where a rank runs tasks in place, every returning key/value row is summed onto its own.
  const cp::WireTable summed = cp::build_wire_table(layout, 0, true, false, 9, true);
  EXPECT_FALSE(summed.exclusive);
  EXPECT_TRUE(summed.single.empty());
  EXPECT_EQ(summed.shared_rows, 9);  // document 0's prefix (server 1) and document 1's head (server 0 itself)
  EXPECT_TRUE(cp::build_wire_table(layout, 0, true, false, 9).exclusive);
}

TEST(WireTables, KeyValueRowsAreExclusiveUnlessAPrefixIsShared) {
  // Each document on its owner: every key/value row comes back from one server.
  const cp::PieceTables tables = {{{0, 5, 0, 5}}, {{1, 4, 0, 4}}};
  const cp::Layout own = cp::build_layout(tables, {{0, 0, 5, 0, 0}, {1, 0, 4, 1, 0}}, true);
  EXPECT_TRUE(cp::build_wire_table(own, 0, true, false, 5).exclusive);
  EXPECT_TRUE(cp::build_wire_table(own, 1, true, false, 4).exclusive);
  // Document 0's tail queries on server 1 need its whole prefix: rows [0, 3) come back from both servers.
  const cp::Layout split = cp::build_layout(tables, {{0, 0, 3, 0, 0}, {0, 3, 5, 1, 0}, {1, 0, 4, 1, 0}}, true);
  EXPECT_FALSE(cp::build_wire_table(split, 0, true, false, 5).exclusive);
  EXPECT_TRUE(cp::build_wire_table(split, 1, true, false, 4).exclusive);
}
// Issue 10: the local token count is a sum of piece lengths; two pieces whose lengths add past
// INT64_MAX are refused (the unchecked sum was undefined behaviour and wrapped negative).
TEST(Validate, PieceLengthsWhoseSumOverflowsAreRefused) {
  const cad_piece_v1_t pieces[] = {{1, INT64_MAX, 0, INT64_MAX}, {2, 2, 0, 2}};
  cad_attention_forward_args_v1_t args{};
  args.struct_size = sizeof args;
  args.pieces = pieces;
  args.num_pieces = 2;
  try {
    cp::check_call(cp::CallArgs::of(&args), cp::Accepts{}, nullptr);
    FAIL() << "pieces holding more than 2^63-1 tokens were accepted";
  } catch (const cad::plugin::Failure& f) {
    EXPECT_EQ(f.status(), CAD_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(f.what()).find("2^63-1 tokens (piece 1"), std::string::npos) << f.what();
  }
}

TEST(WireTables, EveryKeyValueRowIsMovedOnceOrSummedOverItsReadersInPeerOrder) {
  for (uint64_t seed = 30; seed <= 45; ++seed) {
    BatchSpec spec;
    spec.seed = seed;
    spec.world = 1 + static_cast<int32_t>(seed % 4);
    const GlobalBatch b = cad_test::make_batch(spec);
    const cp::Layout layout = cp::build_layout(b.pieces, random_plan(b, seed), true);
    for (int32_t me = 0; me < b.world; ++me) {
      const int64_t tokens = static_cast<int64_t>(b.global_rows(me).size());
      const cp::WireTable t = cp::build_wire_table(layout, me, true, false, tokens);
      // Which peer sent each wire row (the wire is peer after peer).
      std::vector<int32_t> peer_of_wire;
      for (size_t p = 0; p + 1 < t.peer_first.size(); ++p) {
        for (int64_t i = t.peer_first[p]; i < t.peer_first[p + 1]; ++i) {
          peer_of_wire.insert(peer_of_wire.end(), static_cast<size_t>(t.to_wire[static_cast<size_t>(i)].num_rows),
                              static_cast<int32_t>(p));
        }
      }
      std::vector<int> readers(static_cast<size_t>(tokens), 0), moved(static_cast<size_t>(tokens), 0),
          summed(static_cast<size_t>(tokens), 0);
      for (const auto& c : t.to_wire) for (int64_t r = 0; r < c.num_rows; ++r) ++readers[static_cast<size_t>(c.src_row + r)];
      for (const auto& c : t.single) for (int64_t r = 0; r < c.num_rows; ++r) ++moved[static_cast<size_t>(c.dst_row + r)];
      ASSERT_EQ(t.shared_first.size(), static_cast<size_t>(t.shared_rows) + 1);
      ASSERT_EQ(t.shared_owner_rows.size(), static_cast<size_t>(t.shared_rows));
      for (int64_t i = 0; i < t.shared_rows; ++i) {
        const int64_t owner = t.shared_owner_rows[static_cast<size_t>(i)];
        ++summed[static_cast<size_t>(owner)];
        const int64_t begin = t.shared_first[static_cast<size_t>(i)], end = t.shared_first[static_cast<size_t>(i) + 1];
        EXPECT_EQ(end - begin, readers[static_cast<size_t>(owner)]) << "one contribution per server that read it";
        for (int64_t j = begin + 1; j < end; ++j) {
          EXPECT_LT(peer_of_wire[static_cast<size_t>(t.shared_wire_rows[static_cast<size_t>(j) - 1])],
                    peer_of_wire[static_cast<size_t>(t.shared_wire_rows[static_cast<size_t>(j)])])
              << "contributions in rank order: a fixed summation order";
        }
      }
      for (int64_t row = 0; row < tokens; ++row) {
        const int n = readers[static_cast<size_t>(row)];
        EXPECT_GE(n, 1) << "causal: every key is read at least by its own query";
        EXPECT_EQ(moved[static_cast<size_t>(row)], n == 1 ? 1 : 0) << "row " << row;
        EXPECT_EQ(summed[static_cast<size_t>(row)], n > 1 ? 1 : 0) << "row " << row;
      }
      EXPECT_EQ(t.exclusive, t.shared_rows == 0);
    }
  }
}

TEST(WireTables, DirectWhenEveryPeerIsOneRangeAndIdentityImpliesDirect) {
  // Document 0 (len 8) on rank 0; its prefix [0, 8) is read by server 1 (queries [4, 8)) and server 0.
  const cp::PieceTables tables = {{{0, 8, 0, 8}}, {{1, 4, 0, 4}}};
  const cp::Layout layout = cp::build_layout(tables, {{0, 0, 4, 0, 0}, {0, 4, 8, 1, 0}, {1, 0, 4, 1, 0}}, true);
  const cp::WireTable kv = cp::build_wire_table(layout, 0, true, false, 8);
  EXPECT_TRUE(kv.direct) << "each server reads one prefix range";
  EXPECT_FALSE(kv.identity) << "the ranges overlap: no contiguous wire order";
  ASSERT_EQ(kv.peer_row.size(), 2u);
  EXPECT_EQ(kv.peer_row[0], 0);
  EXPECT_EQ(kv.peer_row[1], 0);
  for (uint64_t seed = 80; seed <= 90; ++seed) {
    BatchSpec spec;
    spec.seed = seed;
    spec.world = 3;
    const GlobalBatch b = cad_test::make_batch(spec);
    const cp::Layout l = cp::build_layout(b.pieces, random_plan(b, seed), true);
    for (int32_t me = 0; me < 3; ++me) {
      for (bool owner : {true, false}) {
        for (bool q : {true, false}) {
          const cp::WireTable t = cp::build_wire_table(l, me, owner, q);
          EXPECT_TRUE(!t.identity || t.direct) << "identity implies direct";
          ASSERT_EQ(t.peer_direct.size() + 1, t.peer_first.size());
          bool all = true;
          for (size_t p = 0; p + 1 < t.peer_first.size(); ++p) {  // peer_direct: one range, starting at peer_row
            bool one_range = true;
            int64_t next = t.peer_row[p];
            for (int64_t i = t.peer_first[p]; i < t.peer_first[p + 1]; ++i) {
              one_range = one_range && t.to_wire[static_cast<size_t>(i)].src_row == next;
              next += t.to_wire[static_cast<size_t>(i)].num_rows;
            }
            EXPECT_EQ(t.peer_direct[p], one_range) << "peer " << p;
            all = all && one_range;
          }
          EXPECT_EQ(t.direct, all) << "direct: every peer one range";
        }
      }
    }
  }
}

// ---- One exchange of the CUDA data path, run on the host (device_path.cpp's Mover::start / finish) ----------
// Every rank's tensors and buffers as byte arrays and the collective as copies between them; the copies the kernels
// make as bounds-checked row copies over the plan's wire tables, placed by place_wire_parts and shifted by
// wire_rows_before as the device path does. What arrives must be each destination row's source row, written once.
namespace wire_exchange {

using Bytes = std::vector<std::byte>;

// copy_row_slices on the host: copy c moves c.num_rows rows of `row_bytes` from src row c.src_row to dst row c.dst_row
// (rows `row_bytes` apart), each side from a byte offset (`src_at`, `dst_at`; negative where a table's first wire
// row lies before the buffer's start, as in the device path). `written` counts the destination rows written.
void copy_rows(const Bytes& src, int64_t src_at, Bytes& dst, int64_t dst_at, int64_t row_bytes,
               const std::vector<cp::WireCopy>& copies, int64_t first, int64_t last, std::vector<int>* written) {
  for (int64_t i = first; i < last; ++i) {
    const cp::WireCopy& c = copies[static_cast<size_t>(i)];
    for (int64_t r = 0; r < c.num_rows; ++r) {
      const int64_t from = src_at + (c.src_row + r) * row_bytes, to = dst_at + (c.dst_row + r) * row_bytes;
      ASSERT_TRUE(from >= 0 && from + row_bytes <= static_cast<int64_t>(src.size())) << "read outside the source";
      ASSERT_TRUE(to >= 0 && to + row_bytes <= static_cast<int64_t>(dst.size())) << "write outside the destination";
      std::memcpy(dst.data() + to, src.data() + from, static_cast<size_t>(row_bytes));
      if (written != nullptr) ++(*written)[static_cast<size_t>(to / row_bytes)];
    }
  }
}

// Recognisable rows: byte j of row `row` of tensor `tensor` on rank `rank`.
Bytes tensor(int64_t rows, int64_t row_bytes, int rank, int tensor) {
  Bytes t(static_cast<size_t>(rows * row_bytes));
  for (size_t i = 0; i < t.size(); ++i) {
    const int64_t row = static_cast<int64_t>(i) / row_bytes, j = static_cast<int64_t>(i) % row_bytes;
    t[i] = static_cast<std::byte>((rank * 131 + tensor * 61 + row * 7 + j * 3 + (row >> 5)) & 0xff);
  }
  return t;
}

struct Part {
  bool q;             // query rows (else key/value rows)
  int64_t row_bytes;
};

// One exchange of `parts` in `direction`, every rank at once, as Mover::start / finish run it: `src[r][i]` is rank
// r's tensor of part i on the sending side, `dst[r][i]` on the receiving side, `written[r][i]` counts its rows
// written. `direct`: a part's own rows skip the buffers where one side holds them as one range (else all of them
// go through the receive buffer, the device path's fallback for LSE and summed dK/dV).
void exchange(const cp::Layout& layout, cp::Direction direction, const std::vector<Part>& parts,
              const std::vector<std::vector<Bytes>>& src, std::vector<std::vector<Bytes>>& dst, bool direct,
              std::vector<std::vector<std::vector<int>>>& written) {
  const int32_t world = layout.world;
  const bool to_servers = direction == cp::Direction::ToServers;
  struct Rank {
    std::vector<cp::WireTable> sender, receiver;  // per part
    std::vector<bool> self_direct;
    cp::WirePlacement placed;
    Bytes send, recv;
  };
  std::vector<Rank> ranks(static_cast<size_t>(world));
  for (int32_t me = 0; me < world; ++me) {  // start(): place, pack the others' rows
    Rank& r = ranks[static_cast<size_t>(me)];
    std::vector<cp::WirePart> wire;
    for (const Part& part : parts) {
      r.sender.push_back(cp::build_wire_table(layout, me, to_servers, part.q));
      r.receiver.push_back(cp::build_wire_table(layout, me, !to_servers, part.q));
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const size_t m = static_cast<size_t>(me);
      r.self_direct.push_back(direct && (r.receiver[i].peer_direct[m] || r.sender[i].peer_direct[m]));
      wire.push_back(cp::WirePart{parts[i].row_bytes, &r.sender[i].rows_per_peer, &r.receiver[i].rows_per_peer,
                                  r.self_direct[i]});
    }
    r.placed = cp::place_wire_parts(wire, world, me);
    const cp::Transfer& t = r.placed.transfer;
    EXPECT_EQ(t.send_counts[static_cast<size_t>(me)], 0u) << "rank " << me << " sends itself nothing";
    EXPECT_EQ(t.recv_counts[static_cast<size_t>(me)], 0u) << "rank " << me << " receives nothing from itself";
    r.send.assign(t.send_bytes, std::byte{0});
    r.recv.assign(t.recv_bytes, std::byte{0});
    for (size_t i = 0; i < parts.size(); ++i) {
      const cp::WireTable& s = r.sender[i];
      for (int32_t p = 0; p < world; ++p) {
        if (p == me) continue;
        const size_t pp = static_cast<size_t>(p);
        const int64_t at = static_cast<int64_t>(r.placed.send_at[i][pp]) -
                           cp::wire_rows_before(s.rows_per_peer, p) * parts[i].row_bytes;
        copy_rows(src[static_cast<size_t>(me)][i], 0, r.send, at, parts[i].row_bytes, s.to_wire, s.peer_first[pp],
                  s.peer_first[pp + 1], nullptr);
      }
    }
  }
  for (int32_t a = 0; a < world; ++a) {  // the collective
    for (int32_t b = 0; b < world; ++b) {
      const cp::Transfer& ta = ranks[static_cast<size_t>(a)].placed.transfer;
      const cp::Transfer& tb = ranks[static_cast<size_t>(b)].placed.transfer;
      const uint64_t bytes = ta.send_counts[static_cast<size_t>(b)];
      ASSERT_EQ(bytes, tb.recv_counts[static_cast<size_t>(a)]) << "rank " << a << " -> rank " << b;
      if (bytes == 0) continue;
      std::memcpy(ranks[static_cast<size_t>(b)].recv.data() + tb.recv_displs[static_cast<size_t>(a)],
                  ranks[static_cast<size_t>(a)].send.data() + ta.send_displs[static_cast<size_t>(b)], bytes);
    }
  }
  for (int32_t me = 0; me < world; ++me) {  // start(): the own rows; finish(): unpack
    Rank& r = ranks[static_cast<size_t>(me)];
    const size_t m = static_cast<size_t>(me);
    for (size_t i = 0; i < parts.size(); ++i) {
      const cp::WireTable& s = r.sender[i];
      const cp::WireTable& d = r.receiver[i];
      const int64_t rb = parts[i].row_bytes;
      std::vector<int>* w = &written[m][i];
      if (r.self_direct[i] && d.peer_direct[m]) {  // pack with the sender's table straight into the receiver's range
        copy_rows(src[m][i], 0, dst[m][i], (d.peer_row[m] - cp::wire_rows_before(s.rows_per_peer, me)) * rb, rb,
                  s.to_wire, s.peer_first[m], s.peer_first[m + 1], w);
      } else if (r.self_direct[i]) {  // unpack with the receiver's table from the sender's range
        copy_rows(src[m][i], (s.peer_row[m] - cp::wire_rows_before(d.rows_per_peer, me)) * rb, dst[m][i], 0, rb,
                  d.from_wire, d.peer_first[m], d.peer_first[m + 1], w);
      } else {  // pack into the receive buffer's place for them
        copy_rows(src[m][i], 0, r.recv,
                  static_cast<int64_t>(r.placed.recv_at[i][m]) - cp::wire_rows_before(s.rows_per_peer, me) * rb, rb,
                  s.to_wire, s.peer_first[m], s.peer_first[m + 1], nullptr);
      }
      for (int32_t p = 0; p < world; ++p) {
        const size_t pp = static_cast<size_t>(p);
        if (p == me && r.self_direct[i]) continue;
        const int64_t at = static_cast<int64_t>(r.placed.recv_at[i][pp]) - cp::wire_rows_before(d.rows_per_peer, p) * rb;
        copy_rows(r.recv, at, dst[m][i], 0, rb, d.from_wire, d.peer_first[pp], d.peer_first[pp + 1], w);
      }
    }
  }
}

}  // namespace wire_exchange

// Q, K and V to the servers in one exchange, O back, on 2-5 ranks with random plans: every server row holds its
// owner's row and every owner row its server's, each written once; the own rows straight from tensor to tensor
// or (the fallback) through the receive buffer alike.
TEST(WireExchange, PartsPerPeerAndOwnRowsOffTheWireDeliverEveryRowOnce) {
  using wire_exchange::Bytes;
  for (uint64_t seed = 30; seed <= 45; ++seed) {
    BatchSpec spec;
    spec.seed = seed;
    spec.world = 2 + static_cast<int32_t>(seed % 4);
    const GlobalBatch b = cad_test::make_batch(spec);
    const cp::Layout layout = cp::build_layout(b.pieces, random_plan(b, seed), true);
    const int32_t world = layout.world;
    const int64_t q_bytes = 48, kv_bytes = 16;  // different row sizes: the parts' offsets are not row-aligned
    const std::vector<wire_exchange::Part> in = {{true, q_bytes}, {false, kv_bytes}, {false, kv_bytes}};
    for (bool direct : {true, false}) {
      std::vector<std::vector<Bytes>> owner(static_cast<size_t>(world)), server(static_cast<size_t>(world));
      std::vector<std::vector<std::vector<int>>> written(static_cast<size_t>(world));
      for (int32_t r = 0; r < world; ++r) {
        const size_t m = static_cast<size_t>(r);
        int64_t tokens = 0;
        for (const auto& piece : b.pieces[m]) tokens += piece.len;
        const cp::ServerBatch& batch = layout.servers[m];
        owner[m] = {wire_exchange::tensor(tokens, q_bytes, r, 0), wire_exchange::tensor(tokens, kv_bytes, r, 1),
                    wire_exchange::tensor(tokens, kv_bytes, r, 2)};
        server[m] = {Bytes(static_cast<size_t>(batch.q_rows * q_bytes)), Bytes(static_cast<size_t>(batch.kv_rows * kv_bytes)),
                     Bytes(static_cast<size_t>(batch.kv_rows * kv_bytes))};
        written[m] = {std::vector<int>(static_cast<size_t>(batch.q_rows)), std::vector<int>(static_cast<size_t>(batch.kv_rows)),
                      std::vector<int>(static_cast<size_t>(batch.kv_rows))};
      }
      wire_exchange::exchange(layout, cp::Direction::ToServers, in, owner, server, direct, written);
      for (int32_t s = 0; s < world; ++s) {
        for (int32_t o = 0; o < world; ++o) {
          const cp::Route& route = layout.route(o, s);
          for (size_t i = 0; i < in.size(); ++i) {
            const int64_t rb = in[i].row_bytes;
            for (const cp::RowRun& run : in[i].q ? route.q : route.kv) {
              ASSERT_EQ(std::memcmp(server[static_cast<size_t>(s)][i].data() + run.dst_row * rb,
                                    owner[static_cast<size_t>(o)][i].data() + run.src_row * rb,
                                    static_cast<size_t>(run.count * rb)), 0)
                  << "seed " << seed << " part " << i << " owner " << o << " -> server " << s << " direct " << direct;
            }
          }
        }
        for (size_t i = 0; i < in.size(); ++i) {
          for (int n : written[static_cast<size_t>(s)][i]) ASSERT_EQ(n, 1) << "a server row written " << n << " times";
        }
      }
      // O back to the owners (the server batch's Q tensor stands in for it).
      std::vector<std::vector<Bytes>> out(static_cast<size_t>(world)), back(static_cast<size_t>(world));
      std::vector<std::vector<std::vector<int>>> written_back(static_cast<size_t>(world));
      for (int32_t r = 0; r < world; ++r) {
        const size_t m = static_cast<size_t>(r);
        out[m] = {server[m][0]};
        back[m] = {Bytes(owner[m][0].size())};
        written_back[m] = {std::vector<int>(owner[m][0].size() / static_cast<size_t>(q_bytes))};
      }
      wire_exchange::exchange(layout, cp::Direction::ToOwners, {{true, q_bytes}}, out, back, direct, written_back);
      for (int32_t r = 0; r < world; ++r) {
        EXPECT_EQ(back[static_cast<size_t>(r)][0], owner[static_cast<size_t>(r)][0]) << "seed " << seed << " rank " << r;
        for (int n : written_back[static_cast<size_t>(r)][0]) ASSERT_EQ(n, 1) << "an owner row written " << n << " times";
      }
    }
  }
}

// workspace_sizes' `wire` bounds every buffer of a call's exchanges as the device path places them (the parts of
// each direction, own rows off the wire where a side holds them as one range), with and without kept state.
TEST(WireExchange, WorkspaceWireBoundsEveryExchangeBuffer) {
  for (uint64_t seed = 50; seed <= 65; ++seed) {
    BatchSpec spec;
    spec.seed = seed;
    spec.world = 2 + static_cast<int32_t>(seed % 4);
    const GlobalBatch b = cad_test::make_batch(spec);
    const cp::Layout layout = cp::build_layout(b.pieces, random_plan(b, seed), true);
    cp::CallShape shape;
    shape.num_q_heads = 4, shape.num_kv_heads = 2, shape.head_dim = 16, shape.bf16 = true;
    for (int32_t me = 0; me < layout.world; ++me) {
      const size_t m = static_cast<size_t>(me);
      int64_t tokens = 0;
      for (const auto& piece : b.pieces[m]) tokens += piece.len;
      shape.tokens = tokens;
      const cp::WireTable oq = cp::build_wire_table(layout, me, true, true),
                          okv = cp::build_wire_table(layout, me, true, false, tokens),
                          sq = cp::build_wire_table(layout, me, false, true),
                          skv = cp::build_wire_table(layout, me, false, false);
      const int64_t qb = shape.q_row_bytes(), kvb = shape.kv_row_bytes(), lse = shape.num_q_heads * 4;
      // A part as Mover::start makes it: `from` sends, `to` receives; own rows direct unless LSE or summed.
      const auto part = [&](const cp::WireTable& from, const cp::WireTable& to, int64_t bytes, bool direct) {
        return cp::WirePart{bytes, &from.rows_per_peer, &to.rows_per_peer,
                            direct && (from.peer_direct[m] || to.peer_direct[m])};
      };
      for (bool keep : {true, false}) {
        std::vector<std::vector<cp::WirePart>> calls = {
            {part(oq, sq, qb, true), part(okv, skv, kvb, true), part(okv, skv, kvb, true)},  // Q, K, V in
            {part(sq, oq, qb, true), part(sq, oq, lse, false)},                              // O, LSE back
            {part(oq, sq, qb, true)},                                                        // dO in
            {part(sq, oq, qb, true)},                                                        // dQ back
            {part(skv, okv, kvb, okv.exclusive)},                                            // dK (dV) back
        };
        if (!keep) {
          for (auto p : {part(oq, sq, qb, true), part(oq, sq, qb, true), part(oq, sq, lse, false),
                         part(okv, skv, kvb, true), part(okv, skv, kvb, true)}) {
            calls[2].push_back(p);  // Q, O, LSE, K, V re-sent with dO
          }
        }
        const cp::WorkspaceSizes w = cp::workspace_sizes(layout, me, shape, keep, 0, 0);
        for (size_t c = 0; c < calls.size(); ++c) {
          const cp::Transfer t = cp::place_wire_parts(calls[c], layout.world, me).transfer;
          EXPECT_LE(static_cast<int64_t>(t.send_bytes), w.wire) << "seed " << seed << " rank " << me << " exchange " << c;
          EXPECT_LE(static_cast<int64_t>(t.recv_bytes), w.wire) << "seed " << seed << " rank " << me << " exchange " << c;
        }
      }
    }
  }
}

// The server backend's make_plan args of a server batch: the batch's table and the calls' shape, unchanged.
TEST(ServerPlanArgs, DescribeTheBatchAndTheShape) {
  cad::cad_plugin::ServerBatch batch;
  batch.q_rows = 7;
  batch.kv_rows = 11;
  batch.segments = {{0, 3, 0, 5}, {3, 4, 5, 6}};
  cad::cad_plugin::CallShape shape;
  shape.num_q_heads = 8;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.bf16 = true;
  shape.causal = false;
  shape.device_type = CAD_DEVICE_CUDA;
  shape.device_id = 3;
  int stream_marker = 0;
  const cad_attention_plan_args_v1_t a = cad::cad_plugin::server_plan_args(batch, shape, &stream_marker);
  EXPECT_EQ(a.struct_size, sizeof(a));
  EXPECT_EQ(a.segments, batch.segments.data());
  EXPECT_EQ(a.num_segments, 2);
  EXPECT_EQ(a.num_q_rows, 7);
  EXPECT_EQ(a.num_kv_rows, 11);
  EXPECT_EQ(a.num_q_heads, 8);
  EXPECT_EQ(a.num_kv_heads, 2);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_EQ(a.causal, 0);
  EXPECT_TRUE(cad::plugin::dtype_is(a.dtype, cad::plugin::DType::BF16));
  EXPECT_EQ(a.device.device_type, CAD_DEVICE_CUDA);
  EXPECT_EQ(a.device.device_id, 3);
  EXPECT_EQ(a.stream, &stream_marker);
  EXPECT_EQ(a.num_pieces, 0);
  shape.bf16 = false;
  shape.causal = true;
  const cad_attention_plan_args_v1_t b = cad::cad_plugin::server_plan_args(batch, shape, nullptr);
  EXPECT_TRUE(cad::plugin::dtype_is(b.dtype, cad::plugin::DType::F32));
  EXPECT_EQ(b.causal, 1);
}

// A head group's shape: a divisor of both head counts gives each group Hq/G over Hkv/G heads (the query heads of
// a key/value head stay together) and changes nothing else; anything else is refused naming the config key.
TEST(HeadGroupShape, DividesBothHeadCountsOrIsRefusedNamingTheKey) {
  cad::cad_plugin::CallShape shape;
  shape.tokens = 1000;
  shape.num_q_heads = 32;
  shape.num_kv_heads = 8;
  shape.head_dim = 128;
  shape.bf16 = true;
  shape.softmax_scale = 0.25f;
  for (int32_t groups : {1, 2, 4, 8}) {
    const cad::cad_plugin::CallShape g = cad::cad_plugin::head_group_shape(shape, groups);
    EXPECT_EQ(g.num_q_heads, 32 / groups);
    EXPECT_EQ(g.num_kv_heads, 8 / groups);
    EXPECT_EQ(g.num_q_heads / g.num_kv_heads, 4);  // the GQA ratio a kernel sees is the call's
    EXPECT_EQ(g.tokens, 1000);
    EXPECT_EQ(g.head_dim, 128);
    EXPECT_EQ(g.softmax_scale, 0.25f);
    EXPECT_EQ(g.q_row_bytes() * groups, shape.q_row_bytes());
  }
  for (int32_t groups : {0, 3, 16, -2}) {  // 16 divides Hq, not Hkv
    try {
      cad::cad_plugin::head_group_shape(shape, groups);
      ADD_FAILURE() << groups << " groups were accepted";
    } catch (const cad::plugin::Failure& f) {
      EXPECT_EQ(f.status(), CAD_STATUS_INVALID_CONFIG);
      EXPECT_NE(std::string(f.what()).find("head_groups " + std::to_string(groups) +
                                           " does not divide the call's heads (Hq=32, Hkv=8)"),
                std::string::npos)
          << f.what();
    }
  }
}

// cad_mpi_test.cpp -- multi-rank tests of the CAD plugin, run under mpirun with 1..8 ranks.
//
// Every rank builds the same random global batch from a seed (documents split across ranks, length-1
// documents, empty ranks), runs CAD forward + backward on its own pieces through the stack the host
// adapter builds from a JSON config (mpi communicator, reference server backend, each balancer), and
// compares O, LSE, dQ, dK, dV of its tokens with the reference math run locally over the whole batch.
// Bad inputs must give every rank the same status and message, and never hang (ctest TIMEOUT).
//
// Collective discipline: every rank runs the same tests in the same order and makes the same CAD
// calls; assertions never skip a collective call on one rank only.
#include "cad_mpi_harness.h"

using namespace cad_mpi_test;

TEST(CadMpi, MatchesReferenceForEveryBalancerMaskAndKeepMode) {
  ASSERT_FALSE(balancers().empty());
  uint64_t seed = 100;
  for (const std::string& balancer : balancers()) {
    for (bool causal : {true, false}) {
      for (bool keep : {true, false}) {
        SCOPED_TRACE(balancer + (causal ? " causal" : " non-causal") + (keep ? " keep" : " resend"));
        const GlobalBatch b = cad_test::make_batch(spec_for(++seed));
        expect_step_matches(cad_instance(balancer, keep), b, causal);
      }
    }
  }
}

TEST(CadMpi, MultiHeadAttentionWithWiderHeads) {
  BatchSpec spec = spec_for(7);
  spec.hq = spec.hkv = 3;
  spec.d = 32;
  const GlobalBatch b = cad_test::make_batch(spec);
  expect_step_matches(cad_instance(balancers().back(), true), b, true);
}

TEST(CadMpi, EveryRankEmptyButOne) {
  // All documents on the last rank: every other rank holds nothing but still serves work.
  GlobalBatch b = cad_test::make_batch(spec_for(8));
  for (int r = 0; r + 1 < g_world; ++r) {
    auto& last = b.pieces[static_cast<size_t>(g_world - 1)];
    last.insert(last.end(), b.pieces[static_cast<size_t>(r)].begin(), b.pieces[static_cast<size_t>(r)].end());
    b.pieces[static_cast<size_t>(r)].clear();
  }
  expect_step_matches(cad_instance(balancers().back(), false), b, true);
}

TEST(CadMpi, ResendModeRunsBackwardWithoutItsForward) {
  // keep_forward_tensors false: backward re-sends Q/K/V/O/LSE, so it needs no forward of its own.
  const GlobalBatch b = cad_test::make_batch(spec_for(9));
  LocalCall call(b, true);
  const Outputs want = local_slice(b, oracle(b, true, call.scale));
  call.o.data = want.o;
  call.lse.data = want.lse;
  const Attention a = cad_instance(balancers().front(), false);
  ASSERT_EQ(call.backward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  expect_close(call.d_q.data, want.d_q, "d_q");
  expect_close(call.d_k.data, want.d_k, "d_k");
  expect_close(call.d_v.data, want.d_v, "d_v");
}

TEST(CadMpi, KeepModeRefusesBackwardOfAnotherBatch) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch first = cad_test::make_batch(spec_for(10));
  const GlobalBatch second = cad_test::make_batch(spec_for(11));
  LocalCall f(first, true), s(second, true);
  ASSERT_EQ(f.forward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  const cad_status_t status = s.backward(a);
  const std::string message = a.table->last_error(a.ctx);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << message;
  EXPECT_NE(message.find("keep_forward_tensors"), std::string::npos) << message;
  EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
  EXPECT_EQ(s.d_q.data, filled({s.tokens, first.hq, first.d}, 7.0f).data) << "outputs touched on error";
}

namespace {
// A bf16 copy of an fp32 tensor, with its own descriptor.
struct Bf16Tensor {
  std::vector<int64_t> shape;
  std::vector<uint16_t> data;
  cad_tensor_v1_t view{};

  explicit Bf16Tensor(const Tensor& t) : shape(t.shape) {
    for (float x : t.data) data.push_back(cad_test::to_bf16(x));
  }
  cad_tensor_v1_t* desc() {
    view = cad_tensor_v1_t{data.data(), {CAD_DEVICE_CPU, 0}, static_cast<int32_t>(shape.size()),
                           {CAD_DTYPE_CODE_BFLOAT, 16, 1}, shape.data(), nullptr, 0};
    return &view;
  }
  std::vector<float> floats() const {
    std::vector<float> out;
    for (uint16_t x : data) out.push_back(cad_test::from_bf16(x));
    return out;
  }
};
}  // namespace

TEST(CadMpi, Bf16MatchesTheFp32ReferenceWithinOnePercent) {
  GlobalBatch b = cad_test::make_batch(spec_for(14));
  for (auto* t : {&b.q, &b.k, &b.v, &b.d_o}) {  // the oracle sees exactly the bf16 inputs
    for (float& x : *t) x = cad_test::from_bf16(cad_test::to_bf16(x));
  }
  LocalCall call(b, true);
  const Outputs want = local_slice(b, oracle(b, true, call.scale));
  Bf16Tensor q(call.q), k(call.k), v(call.v), d_o(call.d_o), o(call.o), d_q(call.d_q), d_k(call.d_k), d_v(call.d_v);
  const Attention a = cad_instance(balancers().back(), false);  // resend mode: bf16 Q/K/V/O travel twice

  cad_attention_forward_args_v1_t fwd{};
  fwd.struct_size = sizeof(fwd);
  fwd.pieces = call.pieces.data();
  fwd.num_pieces = static_cast<int64_t>(call.pieces.size());
  fwd.softmax_scale = call.scale;
  fwd.causal = 1;
  fwd.q = q.desc();
  fwd.k = k.desc();
  fwd.v = v.desc();
  fwd.o = o.desc();
  fwd.lse = call.lse.desc();
  ASSERT_EQ(a.table->forward(a.ctx, &fwd), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  cad_attention_backward_args_v1_t bwd{};
  bwd.struct_size = sizeof(bwd);
  bwd.pieces = fwd.pieces;
  bwd.num_pieces = fwd.num_pieces;
  bwd.softmax_scale = call.scale;
  bwd.causal = 1;
  bwd.q = q.desc();
  bwd.k = k.desc();
  bwd.v = v.desc();
  bwd.o = o.desc();
  bwd.lse = call.lse.desc();
  bwd.d_o = d_o.desc();
  bwd.d_q = d_q.desc();
  bwd.d_k = d_k.desc();
  bwd.d_v = d_v.desc();
  ASSERT_EQ(a.table->backward(a.ctx, &bwd), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  expect_close(o.floats(), want.o, "o (bf16)", 1e-2);
  expect_close(call.lse.data, want.lse, "lse (bf16 inputs)", 1e-2);
  expect_close(d_q.floats(), want.d_q, "d_q (bf16)", 1e-2);
  expect_close(d_k.floats(), want.d_k, "d_k (bf16)", 1e-2);
  expect_close(d_v.floats(), want.d_v, "d_v (bf16)", 1e-2);
}

namespace {
struct BadCase {
  const char* name;
  const char* expected;  // a part of the message every rank must get
};

// Runs a forward that must fail on every rank with INVALID_ARGUMENT and the same message.
void expect_refused(const Attention& a, LocalCall& call, const BadCase& c) {
  const cad_status_t status = call.forward(a);
  const std::string message = a.table->last_error(a.ctx);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << c.name << ": " << message;
  EXPECT_NE(message.find(c.expected), std::string::npos) << c.name << ": got '" << message << "'";
  EXPECT_TRUE(same_on_every_rank(message)) << c.name << ": rank " << g_rank << " got '" << message << "'";
  for (float x : call.o.data) {
    if (x != 7.0f) {
      ADD_FAILURE() << c.name << ": rank " << g_rank << " wrote O although the call failed";
      break;
    }
  }
}
}  // namespace

TEST(CadMpi, BadInputsFailTheSameWayOnEveryRankAndNobodyHangs) {
  const Attention a = cad_instance(balancers().back(), true);
  const GlobalBatch good = cad_test::make_batch(spec_for(12));
  const size_t last = static_cast<size_t>(g_world - 1);
  size_t holder = 0;  // some rank that holds pieces
  while (good.pieces[holder].empty()) ++holder;

  {  // The same tokens twice: the last rank also claims a piece of another rank (or its own).
    GlobalBatch b = good;
    b.pieces[last].push_back(good.pieces[holder].front());
    LocalCall call(b, true);
    expect_refused(a, call, {"overlap", "are held twice"});
  }
  {  // A gap: one piece of two or more tokens loses its last token.
    GlobalBatch b = good;
    bool shortened = false;
    for (auto& rank_pieces : b.pieces) {
      for (auto& p : rank_pieces) {
        if (!shortened && p.len >= 2) {
          p.len -= 1;
          shortened = true;
        }
      }
    }
    ASSERT_TRUE(shortened);
    LocalCall call(b, true);
    expect_refused(a, call, {"gap", "are held by no rank"});
  }
  {  // Ranks disagree on a document's length: one piece of a split document says one token more.
    GlobalBatch b = good;
    std::map<int64_t, int> pieces_of;
    for (const auto& rank_pieces : b.pieces) {
      for (const auto& p : rank_pieces) ++pieces_of[p.doc_id];
    }
    bool changed = false;
    for (auto& rank_pieces : b.pieces) {
      for (auto& p : rank_pieces) {
        if (!changed && pieces_of[p.doc_id] > 1) {
          p.doc_len += 1;
          changed = true;
        }
      }
    }
    ASSERT_TRUE(changed);  // the generator always splits one document
    LocalCall call(b, true);
    expect_refused(a, call, {"doc_len", "says doc_len"});
  }
  {  // One rank's tensors do not match its piece table: every rank names that rank.
    LocalCall call(good, true, g_rank == static_cast<int>(last) ? 1 : 0);
    const std::string expected = "forward: rank " + std::to_string(last) + ": tensor 'q' has";
    expect_refused(a, call, {"tensor rows", expected.c_str()});
  }
  if (g_world > 1) {  // One rank uses another head dim.
    LocalCall call(good, true, 0, g_rank == static_cast<int>(last) ? 8 : -1);
    expect_refused(a, call, {"head dim", "ranks disagree on the head layout"});
  }
  // The instance is still usable afterwards.
  expect_step_matches(a, good, true);
}

TEST(CadMpi, StatsCountTheWorkAndTheBytes) {
  const GlobalBatch b = cad_test::make_batch(spec_for(13));
  const Attention a = cad_instance(balancers().back(), true);
  LocalCall call(b, true);
  ASSERT_EQ(call.forward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  size_t needed = 0;
  ASSERT_EQ(a.table->get_stats_json(a.ctx, nullptr, 0, &needed), CAD_STATUS_INVALID_ARGUMENT);
  std::string buffer(needed, '\0');
  ASSERT_EQ(a.table->get_stats_json(a.ctx, buffer.data(), buffer.size(), &needed), CAD_STATUS_OK);
  const nlohmann::json stats = nlohmann::json::parse(buffer.c_str());
  const nlohmann::json& fwd = stats.at("forward");
  ASSERT_EQ(fwd.at("servers").size(), static_cast<size_t>(g_world));
  double entries = 0.0, want = 0.0;
  int64_t q_rows = 0;
  for (const auto& s : fwd.at("servers")) {
    entries += s.at("score_entries").get<double>();
    q_rows += s.at("q_rows").get<int64_t>() + s.at("own_q_rows").get<int64_t>();
  }
  EXPECT_EQ(q_rows, b.total_tokens) << "every token is a query on exactly one server (in its batch or in place)";
  for (const auto& doc : b.docs) want += static_cast<double>(doc.len) * static_cast<double>(doc.len + 1) / 2.0;
  EXPECT_EQ(entries, want) << "the servers together compute exactly the causal attention of the batch";
  uint64_t sent = 0, received = 0;
  for (const auto& x : fwd.at("bytes_sent_by_rank")) sent += x.get<uint64_t>();
  for (const auto& x : fwd.at("bytes_received_by_rank")) received += x.get<uint64_t>();
  EXPECT_EQ(sent, received);
  // The bytes the data path really moved are the ones the project's cost model predicts for the plan.
  EXPECT_EQ(fwd.at("bytes_sent_by_rank").dump(), fwd.at("model_forward_bytes_sent_by_rank").dump());
  EXPECT_EQ(fwd.at("bytes_received_by_rank").dump(), fwd.at("model_forward_bytes_received_by_rank").dump());
  EXPECT_EQ(fwd.at("bytes_sent_by_rank").at(static_cast<size_t>(g_rank)).get<uint64_t>(),
            fwd.at("bytes_sent").get<uint64_t>());
  if (g_world == 1) {
    EXPECT_EQ(sent, 0u);
  }
  EXPECT_FALSE(stats.contains("backward"));
}

TEST(CadMpi, ResultsAreBitwiseReproducibleAndIndependentOfKeepMode) {
  // dK/dV sum the servers' partial results in server order, so repeating a step, or re-sending the
  // forward tensors instead of keeping them, gives identical bits.
  const GlobalBatch b = cad_test::make_batch(spec_for(15));
  std::vector<std::vector<float>> runs;
  for (bool keep : {true, true, false}) {
    LocalCall call(b, true);
    const Attention a = cad_instance(balancers().back(), keep);
    ASSERT_EQ(call.forward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    ASSERT_EQ(call.backward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    std::vector<float> all = call.o.data;
    for (const auto* t : {&call.lse.data, &call.d_q.data, &call.d_k.data, &call.d_v.data}) {
      all.insert(all.end(), t->begin(), t->end());
    }
    runs.push_back(all);
  }
  const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  EXPECT_TRUE(same_bits(runs[0], runs[1])) << "rank " << g_rank << ": a repeated step differs";
  EXPECT_TRUE(same_bits(runs[0], runs[2])) << "rank " << g_rank << ": keep and resend modes differ";
}

TEST(CadMpi, TasksRunInPlaceGiveTheResultsOfTheExchangedPath) {
  // A server runs the tasks on documents it holds whole on its own tensors (own_tasks_in_place) and
  // adds the other servers' dK/dV to theirs: the results are the exchanged path's (and the reference's, which
  // expect_step_matches checks) up to the order of the fp32 sums, in both keep modes, causal or not.
  uint64_t seed = 400;
  for (bool causal : {true, false}) {
    for (bool keep : {true, false}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "non-causal") + (keep ? " keep" : " resend"));
      const GlobalBatch b = cad_test::make_batch(spec_for(++seed));
      const Attention in_place = cad_instance(balancers().front(), keep);
      const Attention exchanged = cad_instance_named("cad_exchange_own");
      expect_step_matches(in_place, b, causal);
      LocalCall x(b, causal), y(b, causal);
      ASSERT_EQ(x.forward(in_place), CAD_STATUS_OK) << in_place.table->last_error(in_place.ctx);
      ASSERT_EQ(x.backward(in_place), CAD_STATUS_OK) << in_place.table->last_error(in_place.ctx);
      ASSERT_EQ(y.forward(exchanged), CAD_STATUS_OK) << exchanged.table->last_error(exchanged.ctx);
      ASSERT_EQ(y.backward(exchanged), CAD_STATUS_OK) << exchanged.table->last_error(exchanged.ctx);
      expect_close(x.o.data, y.o.data, "O");
      expect_close(x.lse.data, y.lse.data, "LSE");
      expect_close(x.d_q.data, y.d_q.data, "dQ");
      expect_close(x.d_k.data, y.d_k.data, "dK");
      expect_close(x.d_v.data, y.d_v.data, "dV");
    }
  }
}

TEST(CadMpi, TasksRunInPlaceOnABackendInstanceOfTheirOwn) {
  // own_server_backend: the tasks run in place go to that instance (on GPUs one that leaves SMs to the collective).
  uint64_t seed = 420;
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    expect_step_matches(cad_instance_named("cad_own_backend"), cad_test::make_batch(spec_for(++seed)), causal);
  }
}

TEST(CadMpi, StatsTellTheTasksRunInPlace) {
  // Where a rank holds whole documents and its balancer keeps some of their queries home, those run in place
  // (own_q_rows), outside the server batch; with own_tasks_in_place false nothing does.
  const GlobalBatch b = cad_test::make_batch(spec_for(17));
  int64_t whole_on_one_rank = 0;  // documents held in one piece
  for (const auto& rank : b.pieces) {
    for (const cad_piece_v1_t& p : rank) whole_on_one_rank += p.len == p.doc_len ? 1 : 0;
  }
  for (const char* name : {"in place", "cad_exchange_own"}) {
    const Attention a = std::string(name) == "in place" ? cad_instance(balancers().front(), true) : cad_instance_named(name);
    LocalCall call(b, true);
    ASSERT_EQ(call.forward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    size_t needed = 0;
    a.table->get_stats_json(a.ctx, nullptr, 0, &needed);
    std::string buffer(needed, '\0');
    ASSERT_EQ(a.table->get_stats_json(a.ctx, buffer.data(), buffer.size(), &needed), CAD_STATUS_OK);
    const nlohmann::json stats = nlohmann::json::parse(buffer.c_str());
    int64_t own = 0, q_rows = 0;
    for (const auto& s : stats.at("forward").at("servers")) {
      own += s.at("own_q_rows").get<int64_t>();
      q_rows += s.at("q_rows").get<int64_t>();
    }
    EXPECT_EQ(own + q_rows, b.total_tokens) << name;
    if (std::string(name) != "in place") {
      EXPECT_EQ(own, 0) << name;
    } else if (whole_on_one_rank > 0) {
      EXPECT_GT(own, 0) << name;
    }
  }
}

TEST(CadMpi, MemoryCapRefusalReachesEveryRank) {
  const GlobalBatch b = cad_test::make_batch(spec_for(16));
  std::map<int64_t, std::set<size_t>> ranks_of;  // does some document live on two ranks?
  for (size_t r = 0; r < b.pieces.size(); ++r) {
    for (const auto& p : b.pieces[r]) ranks_of[p.doc_id].insert(r);
  }
  bool moves_data = false;
  for (const auto& entry : ranks_of) moves_data = moves_data || entry.second.size() > 1;
  const auto capped = g_host->find<cad_attention_v1_t>("cad_capped", CAD_PLUGIN_KIND_ATTENTION);
  const Attention a{capped.first, capped.second};
  LocalCall call(b, true);
  const cad_status_t status = call.forward(a);
  const std::string message = a.table->last_error(a.ctx);
  // A host-split document needs another rank's K/V on some server, which the cap forbids; without
  // one, balancing may still want to move work (refused) or not (accepted).
  if (moves_data || status != CAD_STATUS_OK) {
    EXPECT_EQ(status, CAD_STATUS_UNSUPPORTED) << message;
    EXPECT_NE(message.find("memory_cap_bytes"), std::string::npos) << message;
  }
  EXPECT_TRUE(same_on_every_rank(std::to_string(status) + " " + message)) << "rank " << g_rank << ": " << message;
}

namespace {
// Builds a stack whose CAD instance has `cad_config` (after `extra` instances); returns the host's error (status +
// message).
std::pair<cad_status_t, std::string> create_stack(const nlohmann::json& cad_config,
                                                  const nlohmann::json& extra = nlohmann::json::array()) {
  nlohmann::json instances = nlohmann::json::array();
  instances.push_back({{"name", "comm"}, {"plugin", "mpi"}, {"config", nlohmann::json::object()}});
  instances.push_back({{"name", "server"}, {"plugin", "reference"}, {"config", nlohmann::json::object()}});
  instances.push_back({{"name", "bal"}, {"plugin", balancers().front()}, {"config", nlohmann::json::object()}});
  for (const auto& instance : extra) instances.push_back(instance);
  instances.push_back({{"name", "cad"}, {"plugin", "cad"}, {"config", cad_config}});
  const std::string config = nlohmann::json{{"log_level", "error"}, {"instances", instances}}.dump();
  cad_host_options_v1_t options{};
  options.struct_size = sizeof(options);
  options.config_json = config.c_str();
  options.search_path = CAD_TEST_PLUGIN_DIR;
  try {
    cad::Host host(options);
    return {CAD_STATUS_OK, ""};
  } catch (const cad::Error& e) {
    return {e.status(), e.what()};
  }
}
}  // namespace

TEST(CadMpi, CreateNamesTheMissingInstanceOrBadKey) {
  const nlohmann::json good = {{"communicator", "comm"}, {"balancer", "bal"}, {"server_backend", "server"}};
  EXPECT_EQ(create_stack(good).first, CAD_STATUS_OK) << create_stack(good).second;
  {
    nlohmann::json c = good;
    c["balancer"] = "nope";
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_NOT_FOUND) << message;
    EXPECT_NE(message.find("no balancer instance named 'nope'"), std::string::npos) << message;
  }
  {
    nlohmann::json c = good;
    c["server_backend"] = "comm";  // exists, but is a communicator, not an attention backend
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_NOT_FOUND) << message;
    EXPECT_NE(message.find("no attention instance named 'comm'"), std::string::npos) << message;
  }
  {
    nlohmann::json c = good;
    c.erase("communicator");
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'communicator' is missing"), std::string::npos) << message;
  }
  {
    nlohmann::json c = good;
    c["min_shard_tokens"] = -1;
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'min_shard_tokens'"), std::string::npos) << message;
  }
  {
    nlohmann::json c = good;
    c["keep_forward_tensors"] = "yes";
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'keep_forward_tensors'"), std::string::npos) << message;
  }
  {
    nlohmann::json c = good;
    c["comm_stream_priority"] = "urgent";  // "highest" or "normal"
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'comm_stream_priority'"), std::string::npos) << message;
    c["comm_stream_priority"] = "normal";
    EXPECT_EQ(create_stack(c).first, CAD_STATUS_OK) << create_stack(c).second;
  }
  {
    nlohmann::json c = good;
    c["own_server_backend"] = "comm";  // the tasks run in place need an attention instance too
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_NOT_FOUND) << message;
    EXPECT_NE(message.find("no attention instance named 'comm'"), std::string::npos) << message;
  }
  {
    // An own_server_backend of another kind cannot run the tasks run in place. One that lacks what server batches
    // need is refused as a server backend would be; one that has it but differs otherwise (tests/adapter's
    // fixture with shared_kv: fp32 only, no plans) is refused naming both instances. One of the same kind is taken.
    nlohmann::json extra = nlohmann::json::array(
        {{{"name", "server_own"}, {"plugin", "reference"}, {"config", {{"num_threads", 1}}}}});
    nlohmann::json c = good;
    c["own_tasks_in_place"] = true;
#ifdef CAD_TEST_OTHER_ATTENTION
    extra.push_back({{"name", "fixture"}, {"plugin", CAD_TEST_OTHER_ATTENTION}, {"config", nlohmann::json::object()}});
    extra.push_back({{"name", "fixture_kv"}, {"plugin", CAD_TEST_OTHER_ATTENTION}, {"config", {{"shared_kv", true}}}});
    c["own_server_backend"] = "fixture_kv";
    const auto [status, message] = create_stack(c, extra);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("'own_server_backend' names 'fixture_kv', whose capabilities or plans differ from the "
                           "server backend 'server'"),
              std::string::npos)
        << message;
    c["own_server_backend"] = "fixture";
    const auto [no_kv_status, no_kv_message] = create_stack(c, extra);
    EXPECT_EQ(no_kv_status, CAD_STATUS_UNSUPPORTED) << no_kv_message;
    EXPECT_NE(no_kv_message.find("instance 'fixture' does not support segments that share K/V"), std::string::npos)
        << no_kv_message;
#endif
    c["own_server_backend"] = "server_own";
    EXPECT_EQ(create_stack(c, extra).first, CAD_STATUS_OK) << create_stack(c, extra).second;
  }
  {
    nlohmann::json c = good;
    c["own_tasks_in_place"] = "yes";
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'own_tasks_in_place'"), std::string::npos) << message;
  }
  for (const nlohmann::json& groups : {nlohmann::json(0), nlohmann::json(65), nlohmann::json("2")}) {
    nlohmann::json c = good;
    c["head_groups"] = groups;  // a whole number in [1, 64]
    const auto [status, message] = create_stack(c);
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << groups << ": " << message;
    EXPECT_NE(message.find("key 'head_groups'"), std::string::npos) << message;
  }
  {
    nlohmann::json c = good;
    c["head_groups"] = 2;  // taken on the CPU data path, where it changes nothing (only NCCL's pipelines groups)
    EXPECT_EQ(create_stack(c).first, CAD_STATUS_OK) << create_stack(c).second;
  }
}

// The exchanges of a call by head groups differ in number and size from an unsplit one's: ranks configured with
// different head_groups are refused at the plan, on every rank, before any exchange could pair wrong.
TEST(CadMpi, RanksWithDifferentHeadGroupsAreRefused) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks or more";
  const Attention a = cad_instance_named("cad_head_groups_differ");
  LocalCall call(cad_test::make_batch(spec_for(13)), true);
  EXPECT_EQ(call.forward(a), CAD_STATUS_INVALID_CONFIG);
  const std::string message = a.table->last_error(a.ctx);
  const std::string expected = "ranks disagree on the plugin's head_groups: rank 0 has 1, rank " +
                               std::to_string(g_world - 1) + " has 2";
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << " got '" << message << "'";
}

TEST(CadMpi, CapabilitiesAreTheServerBackendsPlusPieces) {
  const Attention a = cad_instance(balancers().front(), true);
  const auto server = g_host->find<cad_attention_v1_t>("server", CAD_PLUGIN_KIND_ATTENTION);
  cad_attention_capabilities_v1_t mine{}, theirs{};
  mine.struct_size = theirs.struct_size = sizeof(mine);
  ASSERT_EQ(a.table->get_capabilities(a.ctx, &mine), CAD_STATUS_OK);
  ASSERT_EQ(server.first->get_capabilities(server.second, &theirs), CAD_STATUS_OK);
  EXPECT_TRUE(mine.flags & CAD_ATTENTION_CAP_PIECES);
  EXPECT_FALSE(mine.flags & CAD_ATTENTION_CAP_SHARED_KV);  // CAD takes pieces, not segments
  const uint32_t passed_on = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                             CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_WINDOW;
  EXPECT_EQ(mine.flags & passed_on, theirs.flags & passed_on);
  EXPECT_EQ(mine.dtype_mask, theirs.dtype_mask);
  EXPECT_EQ(mine.device_type, theirs.device_type);
  EXPECT_EQ(mine.max_head_dim, theirs.max_head_dim);
}

int main(int argc, char** argv) {
  return cad_mpi_test::run_mpi_tests(argc, argv, cad_mpi_test::stack_config, "CAD stack");
}

// validate.cpp -- see validate.h.
#include "validate.h"

#include <algorithm>
#include <map>

#include "checked_math.h"
#include "plugin_support.h"
#include "window.h"

namespace cad::cad_plugin {

using plugin::DType;
using plugin::fail;
using plugin::format;

namespace {

long long ll(int64_t x) { return static_cast<long long>(x); }

}  // namespace

int64_t count_tokens(const cad_piece_v1_t* pieces, int64_t num_pieces) {
  if (num_pieces < 0) fail(CAD_STATUS_INVALID_ARGUMENT, format("num_pieces is %lld, expected >= 0", ll(num_pieces)));
  if (num_pieces > 0 && pieces == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "pieces is NULL but num_pieces > 0");
  int64_t tokens = 0;
  for (int64_t i = 0; i < num_pieces; ++i) {
    if (pieces[i].len < 0) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("piece %lld (doc %lld) has negative len %lld", ll(i),
                                               ll(pieces[i].doc_id), ll(pieces[i].len)));
    }
    if (!checked::add(tokens, pieces[i].len, &tokens)) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("pieces 0..%lld hold more than 2^63-1 tokens (piece %lld has len %lld)",
                                               ll(i), ll(i), ll(pieces[i].len)));
    }
  }
  return tokens;
}

std::vector<DType> accepted_dtypes(const Accepts& accepts) {
  std::vector<DType> dtypes;
  if (accepts.dtype_mask & CAD_ATTENTION_DTYPE_FP32) dtypes.push_back(DType::F32);
  if (accepts.dtype_mask & CAD_ATTENTION_DTYPE_BF16) dtypes.push_back(DType::BF16);
  return dtypes;
}

void check_causal(int32_t causal, const Accepts& accepts) {
  if (causal != 0 && causal != 1) fail(CAD_STATUS_INVALID_ARGUMENT, format("causal is %d, expected 0 or 1", causal));
  if (causal == 1 && !(accepts.flags & CAD_ATTENTION_CAP_CAUSAL)) {
    fail(CAD_STATUS_UNSUPPORTED, "causal attention: the server backend does not support it");
  }
  if (causal == 0 && !(accepts.flags & CAD_ATTENTION_CAP_NONCAUSAL)) {
    fail(CAD_STATUS_UNSUPPORTED, "non-causal attention: the server backend does not support it");
  }
}

void check_heads(int64_t hq, int64_t hkv, int64_t d, const Accepts& accepts) {
  if (hq < 1 || hkv < 1 || d < 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("heads and head dim must be >= 1: Hq=%lld, Hkv=%lld, D=%lld", ll(hq),
                                             ll(hkv), ll(d)));
  }
  if (hq % hkv != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("Hq=%lld (tensor 'q') is not a multiple of Hkv=%lld (tensor 'k')", ll(hq), ll(hkv)));
  }
  if (hq != hkv && !(accepts.flags & CAD_ATTENTION_CAP_GQA)) {
    fail(CAD_STATUS_UNSUPPORTED, "grouped-query attention (Hq != Hkv): the server backend does not support it");
  }
  if (d > accepts.max_head_dim) {
    fail(CAD_STATUS_UNSUPPORTED, format("head dim %lld: the server backend supports at most %d", ll(d),
                                        accepts.max_head_dim));
  }
}

int64_t check_window(const plugin::Window& window, int32_t causal, const Accepts& accepts) {
  if (!window.finite()) return -1;
  if (causal != 1) {
    fail(CAD_STATUS_UNSUPPORTED, format("window_left = %lld, window_right = %lld with causal = %d: CAD computes "
                                        "sliding windows with causal attention only", ll(window.left),
                                        ll(window.right), causal));
  }
  if (!(accepts.flags & CAD_ATTENTION_CAP_WINDOW)) {
    fail(CAD_STATUS_UNSUPPORTED, format("window_left = %lld: the server backend does not compute sliding windows "
                                        "(no CAD_ATTENTION_CAP_WINDOW)", ll(window.left)));
  }
  return window.left;
}

CallShape check_plan_args(const cad_attention_plan_args_v1_t* args, const Accepts& accepts) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: args is NULL");
  if (args->struct_size < CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE) {  // the v1.2 window is read only when present
    fail(CAD_STATUS_ABI_MISMATCH, format("make_plan: args.struct_size is %zu, expected >= %zu", args->struct_size,
                                         static_cast<size_t>(CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE)));
  }
  const int64_t window_left = check_window(plugin::read_window(args, args->causal == 1, "make_plan"), args->causal, accepts);
  if (args->num_segments != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: CAD takes pieces, not segments (num_segments must be 0)");
  }
  if (args->device.device_type != accepts.device_type) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("make_plan: device type %d, but the server backend's tensors live on "
                                             "device type %d", args->device.device_type, accepts.device_type));
  }
  if (args->stream != nullptr && accepts.device_type == CAD_DEVICE_CPU) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: stream must be NULL for a CPU data path");
  }
  check_causal(args->causal, accepts);
  const std::vector<DType> dtypes = accepted_dtypes(accepts);
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || plugin::dtype_is(args->dtype, d);
  if (!dtype_ok) {
    fail(CAD_STATUS_UNSUPPORTED, format("make_plan: dtype %s is not supported by the server backend",
                                        plugin::dtype_name(args->dtype)));
  }
  check_heads(args->num_q_heads, args->num_kv_heads, args->head_dim, accepts);
  CallShape shape;
  shape.tokens = count_tokens(args->pieces, args->num_pieces);
  shape.num_q_heads = args->num_q_heads;
  shape.num_kv_heads = args->num_kv_heads;
  shape.head_dim = args->head_dim;
  shape.bf16 = plugin::dtype_is(args->dtype, DType::BF16);
  shape.causal = args->causal == 1;
  shape.window_left = window_left;
  shape.device_type = args->device.device_type;
  shape.device_id = args->device.device_id;
  return shape;
}

void check_piece_tables(const PieceTables& tables) {
  struct Holder {
    size_t rank;
    size_t index;
    const cad_piece_v1_t* piece;
  };
  std::map<int64_t, std::vector<Holder>> docs;  // ordered: the first error found is the same everywhere
  for (size_t rank = 0; rank < tables.size(); ++rank) {
    for (size_t i = 0; i < tables[rank].size(); ++i) {
      const cad_piece_v1_t& p = tables[rank][i];
      if (p.len < 1 || !checked::range_within(p.offset_in_doc, p.len, p.doc_len)) {
        fail(CAD_STATUS_INVALID_ARGUMENT,
             format("rank %zu piece %zu (doc %lld): offset_in_doc %lld, len %lld do not fit in doc_len %lld "
                    "(need len >= 1 and 0 <= offset, offset + len <= doc_len)",
                    rank, i, ll(p.doc_id), ll(p.offset_in_doc), ll(p.len), ll(p.doc_len)));
      }
      docs[p.doc_id].push_back(Holder{rank, i, &p});
    }
  }
  for (auto& [doc_id, holders] : docs) {
    const Holder& first = holders.front();
    for (const Holder& h : holders) {
      if (h.piece->doc_len != first.piece->doc_len) {
        fail(CAD_STATUS_INVALID_ARGUMENT,
             format("document %lld: rank %zu piece %zu says doc_len %lld but rank %zu piece %zu says %lld",
                    ll(doc_id), first.rank, first.index, ll(first.piece->doc_len), h.rank, h.index,
                    ll(h.piece->doc_len)));
      }
    }
    std::stable_sort(holders.begin(), holders.end(), [](const Holder& a, const Holder& b) {
      return a.piece->offset_in_doc < b.piece->offset_in_doc;
    });
    int64_t covered = 0;
    const Holder* previous = nullptr;
    for (const Holder& h : holders) {
      const int64_t begin = h.piece->offset_in_doc;
      if (begin > covered) {
        fail(CAD_STATUS_INVALID_ARGUMENT, format("document %lld (doc_len %lld): tokens [%lld, %lld) are held by no rank",
                                                 ll(doc_id), ll(h.piece->doc_len), ll(covered), ll(begin)));
      }
      if (begin < covered) {
        fail(CAD_STATUS_INVALID_ARGUMENT,
             format("document %lld: tokens [%lld, %lld) are held twice, by rank %zu piece %zu and rank %zu piece %zu",
                    ll(doc_id), ll(begin), ll(std::min(covered, begin + h.piece->len)), previous->rank,
                    previous->index, h.rank, h.index));
      }
      covered = begin + h.piece->len;
      previous = &h;
    }
    if (covered != first.piece->doc_len) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("document %lld (doc_len %lld): tokens [%lld, %lld) are held by no rank",
                                               ll(doc_id), ll(first.piece->doc_len), ll(covered),
                                               ll(first.piece->doc_len)));
    }
  }
}

void check_plan(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks, int32_t world,
                const std::string& balancer_name) {
  const std::string who = "balancer instance '" + balancer_name + "' returned an invalid plan: ";
  std::map<int64_t, int64_t> doc_len;
  for (const auto& pieces : tables) {
    for (const cad_piece_v1_t& p : pieces) doc_len[p.doc_id] = p.doc_len;
  }
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> ranges;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const cad_task_v1_t& t = tasks[i];
    if (t.server < 0 || t.server >= world) {
      fail(CAD_STATUS_INTERNAL, who + format("task %zu has server %d, expected [0, %d)", i, t.server, world));
    }
    auto doc = doc_len.find(t.doc_id);
    if (doc == doc_len.end()) {
      fail(CAD_STATUS_INTERNAL, who + format("task %zu names document %lld, which no rank holds", i, ll(t.doc_id)));
    }
    if (t.q_begin < 0 || t.q_end < t.q_begin || t.q_end > doc->second) {  // no arithmetic: cannot overflow
      fail(CAD_STATUS_INTERNAL, who + format("task %zu: queries [%lld, %lld) of document %lld (doc_len %lld)", i,
                                             ll(t.q_begin), ll(t.q_end), ll(t.doc_id), ll(doc->second)));
    }
    if (t.q_end > t.q_begin) ranges[t.doc_id].emplace_back(t.q_begin, t.q_end);
  }
  for (const auto& [doc_id, len] : doc_len) {
    auto found = ranges.find(doc_id);
    std::vector<std::pair<int64_t, int64_t>> r = found == ranges.end() ? decltype(r){} : found->second;
    std::sort(r.begin(), r.end());
    int64_t covered = 0;
    for (const auto& [begin, end] : r) {
      if (begin != covered) {
        fail(CAD_STATUS_INTERNAL, who + format("document %lld: queries from %lld are %s", ll(doc_id),
                                               ll(std::min(begin, covered)),
                                               begin > covered ? "not covered" : "covered twice"));
      }
      covered = end;
    }
    if (covered != len) {
      fail(CAD_STATUS_INTERNAL, who + format("document %lld: queries [%lld, %lld) are not covered", ll(doc_id),
                                             ll(covered), ll(len)));
    }
  }
}

CallShape head_group_shape(const CallShape& shape, int32_t groups) {
  if (groups < 1 || shape.num_q_heads % groups != 0 || shape.num_kv_heads % groups != 0) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("plugin 'cad' config: head_groups %d does not divide the call's heads (Hq=%d, Hkv=%d); give a "
                "divisor of both", groups, shape.num_q_heads, shape.num_kv_heads));
  }
  CallShape group = shape;
  group.num_q_heads = shape.num_q_heads / groups;
  group.num_kv_heads = shape.num_kv_heads / groups;
  return group;
}

cad_attention_plan_args_v1_t server_plan_args(const ServerBatch& batch, const CallShape& shape, void* stream) {
  cad_attention_plan_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit
  args.window_left = shape.window_left;  // the servers' segments keep document positions (layout.h)
  args.window_right = -1;
  args.segments = batch.segments.data();
  args.num_segments = static_cast<int64_t>(batch.segments.size());
  args.num_q_rows = batch.q_rows;
  args.num_kv_rows = batch.kv_rows;
  args.num_q_heads = shape.num_q_heads;
  args.num_kv_heads = shape.num_kv_heads;
  args.head_dim = shape.head_dim;
  args.dtype = shape.bf16 ? cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1} : cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1};
  args.causal = shape.causal ? 1 : 0;
  args.device = cad_device_v1_t{shape.device_type, shape.device_id};
  args.stream = stream;
  return args;
}

}  // namespace cad::cad_plugin

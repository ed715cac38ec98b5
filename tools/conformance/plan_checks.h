// plan_checks.h -- what a balancer's plan must satisfy, as plain functions over plain data so the kit's
// own tests can feed them hand-made plans. Internal to the kit.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cad_balancer_v1.h"

namespace cad::conformance {

// Piece tables of all ranks, owning their storage.
struct PieceTables {
  std::vector<std::vector<cad_piece_v1_t>> ranks;
  std::vector<cad_rank_pieces_v1_t> views;  // filled by refresh_views()
  void refresh_views();
  int64_t num_documents() const;
};

// Random piece tables for `num_ranks` ranks: documents of random lengths (1 token, short, longer than
// a rank's buffer) packed rank after rank so that documents straddle ranks, some documents cut by
// the host into pieces scattered over ranks, and `empty_ranks` ranks left without tokens.
PieceTables random_piece_tables(int num_ranks, int empty_ranks, std::mt19937_64& rng);

// "" if the plan is valid for these pieces and server count, else the first violation: format
// version, server count, servers in range, reserved 0, non-empty task ranges inside their document,
// tasks sorted by (server, doc_id, q_begin), every document's queries covered exactly once.
std::string plan_violation(const PieceTables& tables, int num_servers, const cad_plan_v1_t& plan);

}  // namespace cad::conformance

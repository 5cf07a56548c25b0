// The records the node's roles journal (journal.h), each in its own file, by role. Not a public
// header; docs/node.md lists the files and what a restart does with each.
//
//   solver         <data_dir>/secret_chain.json         SecretEpoch
//                  <data_dir>/units/<T>-<i>/progress.json UnitProgress  (after each checkpoint)
//                  <data_dir>/units/<T>-<i>/done.json     UnitDone      (the unit trained)
//                  <data_dir>/units/<T>-<i>/commit.json   UnitCommit    (what CommitUnit carried)
//   aggregator     <data_dir>/aggregates/<T>-<r>.json     AggregateDone (the new state stored)
//   verifier       <data_dir>/verify/<T>-<i>-<h>/verdict.json   VerdictRecord
//   whistleblower  <data_dir>/verify/<T>-<i>-<h>/challenge.json ChallengeRecord
//   disputes       <data_dir>/verify/<T>-<i>-<h>/dispute-<first>-<last>.json DisputeHashes
//                  <data_dir>/verify/<T>-<i>-<h>/recheck-<step>-<height>.json ServedRecheck
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/hash.h"

namespace meshlearn::node::journal {

// The solver's secret chain of the current registration (secret_chain.h).
struct SecretEpoch {
  static constexpr std::string_view kKind = "secret_epoch";
  static constexpr uint32_t kVersion = 1;
  uint64_t epoch = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("epoch", s.epoch);
  }
};

// A unit in training: where its last checkpoint is and the state hashes up to it.
struct UnitProgress {
  static constexpr std::string_view kKind = "unit_progress";
  static constexpr uint32_t kVersion = 1;
  Hash256 start_state;  // the round's start state it trains from
  uint64_t stream = 0;  // protocol::UnitSeed: a re-run of the round with other work is not resumed
  int64_t step = 0;
  uint64_t loss_sum_bits = 0;  // the double's bits: resuming gives the same mean loss, bit for bit
  std::string checkpoint;      // file name in the unit's directory
  std::vector<Hash256> hashes;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("start_state", s.start_state);
    v("stream", s.stream);
    v("step", s.step);
    v("loss_sum_bits", s.loss_sum_bits);
    v("checkpoint", s.checkpoint);
    v("hashes", s.hashes);
  }
};

// A unit trained: its delta is stored (pinned) and these are the facts a commit carries.
struct UnitDone {
  static constexpr std::string_view kKind = "unit_done";
  static constexpr uint32_t kVersion = 1;
  Hash256 start_state;
  Hash256 result;      // the delta blob
  Hash256 commitment;  // Merkle root of the leaves
  uint64_t loss_micros = 0;
  uint32_t round = 0;
  uint32_t shard = 0;
  std::vector<Hash256> leaves;  // true state hashes
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("start_state", s.start_state);
    v("result", s.result);
    v("commitment", s.commitment);
    v("loss_micros", s.loss_micros);
    v("round", s.round);
    v("shard", s.shard);
    v("leaves", s.leaves);
  }
};

// What the last CommitUnit of a unit committed (a forced error commits other leaves than its
// true ones) and so what the solver serves.
struct UnitCommit {
  static constexpr std::string_view kKind = "unit_commit";
  static constexpr uint32_t kVersion = 1;
  uint64_t secret_index = 0;
  bool forced = false;
  Hash256 commitment;
  std::vector<Hash256> leaves;  // served
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("secret_index", s.secret_index);
    v("forced", s.forced);
    v("commitment", s.commitment);
    v("leaves", s.leaves);
  }
};

// A round aggregated: the new state is stored (pinned); a re-run round has other inputs.
struct AggregateDone {
  static constexpr std::string_view kKind = "aggregate_done";
  static constexpr uint32_t kVersion = 1;
  Hash256 start_state;
  Hash256 state;
  uint32_t accuracy_ppm = 0;
  uint64_t loss_micros = 0;
  std::vector<uint64_t> input_indices;  // the units aggregated, with
  std::vector<Hash256> input_results;   // their delta blobs
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("start_state", s.start_state);
    v("state", s.state);
    v("accuracy_ppm", s.accuracy_ppm);
    v("loss_micros", s.loss_micros);
    v("input_indices", s.input_indices);
    v("input_results", s.input_results);
  }
};

// What replaying segments of a checked unit found (the verifier's verdict, the whistleblower's
// challenge): the committed leaves and, on a mismatch, the claim's segment and replayed end, and
// the solver's checkpoint the replay started from ("" = the unit's start).
struct Finding {
  std::vector<Hash256> leaves;
  bool mismatch = false;
  bool result_wrong = false;  // the result check found the result not the final state's delta
  uint32_t segment = 0;
  Hash256 replayed_end;
  std::string checkpoint;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("leaves", s.leaves);
    v("mismatch", s.mismatch);
    v("result_wrong", s.result_wrong);
    v("segment", s.segment);
    v("replayed_end", s.replayed_end);
    v("checkpoint", s.checkpoint);
  }
};

// A verifier's verdict, decided: the salt and commitment let a restarted node still reveal.
struct VerdictRecord {
  static constexpr std::string_view kKind = "verdict";
  static constexpr uint32_t kVersion = 1;
  Finding finding;
  uint32_t verdict = 0;  // protocol::Verdict
  Hash256 salt;
  Hash256 commitment;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    Finding::Visit(s.finding, v);
    v("verdict", s.verdict);
    v("salt", s.salt);
    v("commitment", s.commitment);
  }
};

// A whistleblower's challenge (always a mismatch).
struct ChallengeRecord {
  static constexpr std::string_view kKind = "challenge";
  static constexpr uint32_t kVersion = 1;
  Finding finding;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    Finding::Visit(s.finding, v);
  }
};

// A step this node claimed a stage served nothing for, checked from the pieces the stage then
// served on chain (Disputes::RunServedRecheck): the served step (game step `step`, ruled served at
// `height`) and what its replay found, journaled before anything is sent. A clean finding
// (mismatch false) is not checked again after a restart; a mismatch is challenged from this
// record without replaying the step again.
struct ServedRecheck {
  static constexpr std::string_view kKind = "served_recheck";
  static constexpr uint32_t kVersion = 1;
  uint64_t step = 0;
  uint64_t height = 0;
  Finding finding;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("step", s.step);
    v("height", s.height);
    Finding::Visit(s.finding, v);
  }
};

// The state hash after every step of a disputed segment [first, last], replayed once.
struct DisputeHashes {
  static constexpr std::string_view kKind = "dispute_hashes";
  static constexpr uint32_t kVersion = 1;
  std::vector<Hash256> hashes;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("hashes", s.hashes);
  }
};

}  // namespace meshlearn::node::journal

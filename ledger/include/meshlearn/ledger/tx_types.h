// THE list of transaction types. Everything that dispatches on a type (the TxType enum, the
// TxPayload variant, encoding, JSON, execution) is generated from this one macro, so adding a
// transaction type is:
//
//   1. a line here:        X(Name, tag, module)     tag: the wire number, never reused
//   2. a payload struct:   struct NameTx { ...fields...; static void Visit(...) } in tx.h
//   3. an executor:        Status ExecuteName(ExecContext& ctx, const NameTx& tx)
//                          in ledger/src/<module>.cc (declared for you in src/execute.h)
//   4. tests:              ledger/src/<module>_test.cc, success and failure paths
//
// The compiler (or the linker, for a missing executor) refuses a half-added type. See
// docs/ledger.md, "Adding a transaction type".
#pragma once

// X(Name, wire tag, module file under ledger/src/)
#define MESHLEARN_LEDGER_TX_TYPES(X)      \
  X(Transfer, 1, accounts)                \
  X(Faucet, 2, accounts)                  \
  X(Stake, 10, staking)                   \
  X(Unstake, 11, staking)                 \
  X(Withdraw, 12, staking)                \
  X(RegisterNode, 20, nodes)              \
  X(UpdateNode, 21, nodes)                \
  X(Heartbeat, 22, nodes)                 \
  X(LeaveNode, 23, nodes)                 \
  X(ReportLinks, 24, nodes)               \
  X(SubmitTask, 30, tasks)                \
  X(CancelTask, 31, tasks)                \
  X(CommitUnit, 40, network)              \
  X(CommitAggregate, 41, network)         \
  X(ReportUnavailable, 42, network)       \
  X(CommitStage, 43, network)             \
  X(CommitVerdict, 50, verification)      \
  X(RevealVerdict, 51, verification)      \
  X(RevealSecret, 52, verification)       \
  X(DisputePost, 53, verification)        \
  X(ChallengeUnit, 54, verification)      \
  X(RuleDispute, 55, verification)        \
  X(RefereeStep, 56, verification)        \
  X(ProveResult, 57, verification)        \
  X(ProveFraud, 58, verification)         \
  X(DisputeChildren, 59, verification)    \
  X(RefereeTile, 60, verification)        \
  X(RefereeStageStep, 61, verification)   \
  X(ServeStageEvidence, 62, verification) \
  X(ProveMerits, 63, verification)        \
  X(LateChallenge, 64, verification)      \
  X(CommitProof, 65, proof_commits)

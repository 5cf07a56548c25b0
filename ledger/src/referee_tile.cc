#include "meshlearn/ledger/referee_tile.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/encoding.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/ledger/step_witness.h"
#include "witness_codec.h"

namespace meshlearn::ledger {
namespace {

constexpr char kTileWitnessMagic[] = "meshlearn.tile_witness.v1";
// A witness with token pages (after the partial sum); one without keeps the v1 bytes.
constexpr char kTileWitnessMagicPages[] = "meshlearn.tile_witness.v2";
// A witness with chunked examples (after the pages, which may be none).
constexpr char kTileWitnessMagicChunks[] = "meshlearn.tile_witness.v3";
constexpr uint32_t kTileWitnessMaxItems = 1u << 20;

void PutChunkedExamples(Encoder& e, const std::vector<TileWitnessChunkedExample>& examples) {
  e.PutU32(static_cast<uint32_t>(examples.size()));
  for (const TileWitnessChunkedExample& x : examples) {
    e.PutU64(x.index).PutU32(static_cast<uint32_t>(x.y)).PutHash(x.chunk_root);
    PutMerkleProof(e, x.proof);
    e.PutU32(static_cast<uint32_t>(x.chunks.size()));
    for (const TileWitnessChunk& c : x.chunks) {
      PutWitnessFloats(e, c.values);
      PutMerkleProof(e, c.proof);
    }
  }
}

Status GetChunkedExamples(Decoder& d, std::vector<TileWitnessChunkedExample>* examples) {
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "chunked examples", kMaxWitnessItems, 64));
  examples->resize(n);
  for (TileWitnessChunkedExample& x : *examples) {
    ML_RETURN_IF_ERROR(d.GetU64(&x.index, "example.index"));
    uint32_t y = 0;
    ML_RETURN_IF_ERROR(d.GetU32(&y, "example.y"));
    x.y = static_cast<int32_t>(y);
    ML_RETURN_IF_ERROR(d.GetHash(&x.chunk_root, "example.chunk_root"));
    ML_RETURN_IF_ERROR(GetMerkleProof(d, &x.proof, "example.proof"));
    uint32_t k = 0;
    ML_RETURN_IF_ERROR(d.GetCount(&k, "example.chunks", kMaxWitnessItems, 24));
    x.chunks.resize(k);
    for (TileWitnessChunk& c : x.chunks) {
      ML_RETURN_IF_ERROR(GetWitnessFloats(d, &c.values, "chunk.values"));
      ML_RETURN_IF_ERROR(GetMerkleProof(d, &c.proof, "chunk.proof"));
    }
  }
  return Status::Ok();
}

// RuleTile's step 3 for example `i` of a task whose examples are chunked: its chunks must be the
// footprint's, each of its length and proven against the example's chunk root, and its leaf over
// that root proven against the data root (its index was checked against the batch). The tile
// reads the example as those chunks, zeros elsewhere (engine::TileInputs::x).
Status TileRuleChunkedExample(const TileRuleContext& ctx, const engine::TileFootprint& fp,
                              const TileWitnessChunkedExample& e, size_t i,
                              const std::string& where, engine::TileInputs* in) {
  const int64_t n = ctx.plan.input_size;
  const std::string what =
      where + ": example " + std::to_string(i) + " (index " + std::to_string(e.index) + ")";
  if (e.proof.index != e.index || e.proof.leaf_count != ctx.num_examples ||
      !MerkleVerify(
          ctx.data_root,
          engine::ChunkedExampleLeaf(e.index, e.y, static_cast<uint64_t>(n), e.chunk_root),
          e.proof)) {
    return InvalidArgument(what + " is not proven against the data root " +
                           ctx.data_root.ShortHex());
  }
  if (e.chunks.size() != fp.batch_chunks.size()) {
    return InvalidArgument(what + " carries " + std::to_string(e.chunks.size()) +
                           " chunks; the footprint reads " +
                           std::to_string(fp.batch_chunks.size()));
  }
  std::vector<float> x(static_cast<size_t>(n), 0.0f);
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const TileWitnessChunk& c = e.chunks[k];
    const int64_t chunk = fp.batch_chunks[k], c0 = chunk * engine::kExampleChunkFloats;
    const size_t len = static_cast<size_t>(std::min(n - c0, engine::kExampleChunkFloats));
    if (c.proof.index != static_cast<uint64_t>(chunk) || c.values.size() != len) {
      return InvalidArgument(
          what + ": chunk " + std::to_string(k) + " is chunk " + std::to_string(c.proof.index) +
          " of " + std::to_string(c.values.size()) + " floats; the footprint reads chunk " +
          std::to_string(chunk) + " there, of " + std::to_string(len));
    }
    if (c.proof.leaf_count != static_cast<uint64_t>(engine::ExampleChunks(n)) ||
        !MerkleVerify(e.chunk_root,
                      engine::ExampleChunkLeaf(static_cast<uint64_t>(chunk), c.values), c.proof)) {
      return InvalidArgument(what + ": chunk " + std::to_string(chunk) +
                             " is not proven against the example's chunk root " +
                             e.chunk_root.ShortHex());
    }
    std::copy(c.values.begin(), c.values.end(), x.begin() + c0);
  }
  in->x.push_back(std::move(x));
  in->y.push_back(e.y);
  return Status::Ok();
}

// RuleTile's step 3 for a token task: the witness's pages must be exactly those holding the
// footprint's rows' tokens and targets (engine::TokenPagesOfRows), each of its full length and
// proven against the data root; the rows' tokens and targets are read from them.
Status TileRuleTokens(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                      const engine::TileFootprint& fp, const TileWitness& w,
                      const std::string& where, engine::TileInputs* in) {
  if (!w.examples.empty()) {
    return InvalidArgument(where + ": the witness has examples; a token task's rows read pages");
  }
  if (fp.batch_rows.empty()) {
    if (!w.pages.empty()) {
      return InvalidArgument(where + ": the witness has " + std::to_string(w.pages.size()) +
                             " token pages; the footprint reads no tokens");
    }
    return Status::Ok();
  }
  const engine::TilePlan& plan = ctx.plan;
  const int64_t T = plan.seq_len, n = static_cast<int64_t>(ctx.num_examples);
  if (ctx.data_root.IsZero()) {
    return InvalidArgument(where + ": the task has no data root; its tokens cannot be proven");
  }
  if (T < 1 || n < T + 1) {
    return InvalidArgument(where + ": the task's token stream has " + std::to_string(n) +
                           " tokens, fewer than a window of " + std::to_string(T + 1));
  }
  const int64_t B = plan.batch / T, step = static_cast<int64_t>(task.step) - 1;
  const std::vector<int64_t> want =
      engine::TokenPagesOfRows(ctx.seed, ctx.stream, step, B, T, n, fp.batch_rows);
  ML_RETURN_IF_ERROR(
      CheckWitnessPages(w.pages, want, n, ctx.data_root, where, "the footprint's rows"));
  const std::vector<int64_t> starts = engine::WindowStarts(ctx.seed, ctx.stream, step, B, n, T);
  auto token_at = [&](int64_t pos) {
    const int64_t page = pos / engine::kTokenPageTokens;
    const size_t i =
        static_cast<size_t>(std::lower_bound(want.begin(), want.end(), page) - want.begin());
    return w.pages[i].tokens[static_cast<size_t>(pos - page * engine::kTokenPageTokens)];
  };
  for (int64_t row : fp.batch_rows) {
    const int64_t pos = starts[static_cast<size_t>(row / T)] + row % T;
    in->tokens.push_back(token_at(pos));
    in->y.push_back(token_at(pos + 1));
  }
  return Status::Ok();
}

}  // namespace

size_t StateOperators(const engine::TilePlan& plan) {
  size_t k = 0;
  while (k < plan.ops.size() && plan.ops[k].kind == engine::TileOpKind::kTileOpState &&
         !plan.ops[k].received) {
    ++k;
  }
  return k;
}

Status CheckWitnessPages(std::span<const TileWitnessPage> pages, const std::vector<int64_t>& want,
                         int64_t n, const Hash256& data_root, const std::string& where,
                         const std::string& reader) {
  if (pages.size() != want.size()) {
    return InvalidArgument(where + ": the witness has " + std::to_string(pages.size()) +
                           " token pages; " + reader + " read " + std::to_string(want.size()));
  }
  const uint64_t num_pages =
      static_cast<uint64_t>((n + engine::kTokenPageTokens - 1) / engine::kTokenPageTokens);
  for (size_t i = 0; i < want.size(); ++i) {
    const TileWitnessPage& p = pages[i];
    const int64_t first = want[i] * engine::kTokenPageTokens;
    const size_t len = static_cast<size_t>(std::min(n - first, engine::kTokenPageTokens));
    if (p.page != static_cast<uint64_t>(want[i]) || p.tokens.size() != len) {
      return InvalidArgument(where + ": token page " + std::to_string(i) + " is page " +
                             std::to_string(p.page) + " of " + std::to_string(p.tokens.size()) +
                             " tokens; " + reader + " read page " + std::to_string(want[i]) +
                             " there, of " + std::to_string(len));
    }
    if (p.proof.index != p.page || p.proof.leaf_count != num_pages ||
        !MerkleVerify(data_root, engine::TokenPageLeaf(p.page, p.tokens), p.proof)) {
      return InvalidArgument(where + ": token page " + std::to_string(p.page) +
                             " is not proven against the task's data root " + data_root.ShortHex());
    }
  }
  return Status::Ok();
}

Bytes EncodeTileWitness(const TileWitness& w) {
  Encoder e;
  e.PutString(!w.chunked.empty() ? kTileWitnessMagicChunks
              : w.pages.empty()  ? kTileWitnessMagic
                                 : kTileWitnessMagicPages);
  e.PutU32(static_cast<uint32_t>(w.outputs.size()));
  for (const Hash256& h : w.outputs) e.PutHash(h);
  PutWitnessTiles(e, w.tiles);
  PutWitnessExamples(e, w.examples);
  PutWitnessFloats(e, w.partial);
  if (!w.pages.empty() || !w.chunked.empty()) PutWitnessPages(e, w.pages);
  if (!w.chunked.empty()) PutChunkedExamples(e, w.chunked);
  return e.Take();
}

Result<TileWitness> DecodeTileWitness(ByteSpan bytes) {
  Decoder d(bytes, "tile witness");
  std::string magic;
  ML_RETURN_IF_ERROR(d.GetString(&magic, "magic", 64));
  const bool pages = magic == kTileWitnessMagicPages;
  const bool chunks = magic == kTileWitnessMagicChunks;
  if (magic != kTileWitnessMagic && !pages && !chunks) {
    return InvalidArgument("tile witness: magic '" + magic + "', expected '" + kTileWitnessMagic +
                           "' (or '" + kTileWitnessMagicPages + "' with token pages, '" +
                           kTileWitnessMagicChunks + "' with chunked examples)");
  }
  TileWitness w;
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "outputs", kTileWitnessMaxItems, 32));
  w.outputs.resize(n);
  for (Hash256& h : w.outputs) ML_RETURN_IF_ERROR(d.GetHash(&h, "outputs"));
  ML_RETURN_IF_ERROR(GetWitnessTiles(d, &w.tiles, kTileWitnessMaxItems, 28));
  ML_RETURN_IF_ERROR(GetWitnessExamples(d, &w.examples));
  ML_RETURN_IF_ERROR(GetWitnessFloats(d, &w.partial, "partial"));
  if (pages || chunks) ML_RETURN_IF_ERROR(GetWitnessPages(d, &w.pages));
  if (pages && w.pages.empty()) {
    return InvalidArgument(std::string("tile witness: a '") + kTileWitnessMagicPages +
                           "' witness holds at least one token page");
  }
  if (chunks) {
    ML_RETURN_IF_ERROR(GetChunkedExamples(d, &w.chunked));
    if (w.chunked.empty()) {
      return InvalidArgument(std::string("tile witness: a '") + kTileWitnessMagicChunks +
                             "' witness holds at least one chunked example");
    }
  }
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

Result<TileWitness> BuildTileWitness(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                                     const engine::OpTrace& trace, const engine::Batch& batch,
                                     const engine::ClassificationData* train,
                                     const engine::DataTree* tree,
                                     const engine::TokenPageTree* pages) {
  const engine::TilePlan& plan = ctx.plan;
  if (RulesFromRoots(plan, task) && trace.size() == plan.ops.size()) {
    const size_t m = task.roots == protocol::RefereeRoots::kRootsChainEnd
                         ? plan.ops.size()
                         : StateOperators(plan);
    TileWitness w;
    w.outputs.assign(trace.hashes().begin(), trace.hashes().begin() + static_cast<ptrdiff_t>(m));
    return w;
  }
  if (!task.tile || task.operator_index == 0 || task.operator_index > plan.ops.size() ||
      trace.size() != plan.ops.size()) {
    return FailedPrecondition("tile witness: the task is not a tile of this step's operators");
  }
  const int64_t op = static_cast<int64_t>(task.operator_index) - 1;
  ML_ASSIGN_OR_RETURN(engine::TileFootprint fp,
                      engine::Footprint(plan, op, static_cast<int64_t>(task.tile_index),
                                        static_cast<int64_t>(task.block)));
  TileWitness w;
  w.outputs.assign(trace.hashes().begin(), trace.hashes().begin() + op);
  std::vector<std::vector<Hash256>> hashes(plan.ops.size());
  for (const engine::TileRef& r : fp.tiles) {
    const size_t i = static_cast<size_t>(r.op);
    const engine::TileGrid& g = plan.ops[i].grid;
    if (hashes[i].empty()) hashes[i] = engine::TileHashes(trace.values(i), g);
    w.tiles.push_back(TileWitnessTile{static_cast<uint32_t>(r.op + 1),
                                      static_cast<uint64_t>(r.tile),
                                      engine::ExtractTile(trace.values(i), g, r.tile),
                                      MerkleProve(hashes[i], static_cast<uint64_t>(r.tile))});
  }
  if (!fp.batch_rows.empty() && plan.tokens) {
    if (pages == nullptr) {
      return FailedPrecondition(
          "tile witness: the footprint reads the batch's tokens; give the "
          "token pages");
    }
    const int64_t T = plan.seq_len;
    w.pages = ProvenPages(
        *pages, engine::TokenPagesOfRows(ctx.seed, ctx.stream, static_cast<int64_t>(task.step) - 1,
                                         plan.batch / T, T, pages->num_tokens(), fp.batch_rows));
  } else if (!fp.batch_rows.empty()) {
    if (train == nullptr || tree == nullptr) {
      return FailedPrecondition("tile witness: the footprint reads examples; give the data");
    }
    const std::vector<int64_t> indices = engine::BatchIndices(
        ctx.seed, ctx.stream, train->size(), plan.batch, static_cast<int64_t>(task.step) - 1);
    const int64_t n = plan.input_size;
    for (int64_t row : fp.batch_rows) {
      const int64_t idx = indices[static_cast<size_t>(row)];
      const float* x = train->x.data() + idx * n;
      if (engine::ExampleChunks(n) > 0) {
        const std::span<const float> xs(x, static_cast<size_t>(n));
        // The example's chunks are hashed once, for its root and every chunk's proof.
        const std::vector<Hash256> leaves = engine::ExampleChunkLeaves(xs);
        TileWitnessChunkedExample& e =
            w.chunked.emplace_back(TileWitnessChunkedExample{static_cast<uint64_t>(idx),
                                                             train->y[static_cast<size_t>(idx)],
                                                             engine::ExampleChunkRoot(leaves),
                                                             tree->Prove(idx),
                                                             {}});
        for (int64_t k : fp.batch_chunks) {
          const std::span<const float> c = engine::ExampleChunk(xs, k);
          e.chunks.push_back(TileWitnessChunk{std::vector<float>(c.begin(), c.end()),
                                              engine::ProveExampleChunk(leaves, k)});
        }
        continue;
      }
      w.examples.push_back(
          StepWitnessExample{static_cast<uint64_t>(idx), std::vector<float>(x, x + n),
                             train->y[static_cast<size_t>(idx)], tree->Prove(idx)});
    }
  }
  if (task.reduction_blocks > 0 && task.block > 0) {
    ML_ASSIGN_OR_RETURN(std::vector<std::vector<float>> chain,
                        engine::ReductionChain(plan, op, static_cast<int64_t>(task.tile_index),
                                               static_cast<int64_t>(task.step) - 1, trace, batch));
    w.partial = std::move(chain[task.block]);
  }
  return w;
}

Result<DisputeMoveAnswer> AnswerTileQuery(const TileRuleContext& ctx,
                                          const protocol::DisputeQuery& q,
                                          const Hash256& state_input, const engine::OpTrace& trace,
                                          const engine::Batch& batch) {
  const engine::TilePlan& plan = ctx.plan;
  const std::string where = "dispute move (step " + std::to_string(q.step) + ")";
  if (trace.size() != plan.ops.size()) {
    return InvalidArgument(where + ": the trace has " + std::to_string(trace.size()) +
                           " operators, the plan " + std::to_string(plan.ops.size()));
  }
  DisputeMoveAnswer a;
  if (q.stage == protocol::DisputeStage::kDisputeOperators) {
    if (q.position > trace.size()) {
      return InvalidArgument(where + ": C_" + std::to_string(q.position) + " is past the step's " +
                             std::to_string(trace.size()) + " operators");
    }
    a.hash = state_input;
    for (uint64_t j = 0; j < q.position; ++j) {
      a.hash = protocol::OperatorChainHash(a.hash, trace.hash(static_cast<size_t>(j)));
    }
    return a;
  }
  if (q.operator_index == 0 || q.operator_index > trace.size()) {
    return InvalidArgument(where + ": operator " + std::to_string(q.operator_index) +
                           " is not one of the step's " + std::to_string(trace.size()));
  }
  const size_t op = q.operator_index - 1;
  if (q.stage == protocol::DisputeStage::kDisputeTiles) {
    if (!q.children) {
      a.hash = trace.hash(op);
      return a;
    }
    // The Merkle levels over the operator's tiles (base/merkle.h: an odd last node is promoted).
    std::vector<Hash256> level;
    for (const Hash256& h : engine::TileHashes(trace.values(op), trace.grid(op))) {
      level.push_back(MerkleLeafHash(h));
    }
    for (uint32_t l = 0; l + 1 < q.level; ++l) {
      std::vector<Hash256> next;
      for (size_t i = 0; i + 1 < level.size(); i += 2) {
        next.push_back(MerkleInnerHash(level[i], level[i + 1]));
      }
      if (level.size() % 2 == 1) next.push_back(level.back());
      level = std::move(next);
    }
    if (q.level == 0 || 2 * q.position + 1 >= level.size()) {
      return InvalidArgument(where + ": node " + std::to_string(q.position) + " at level " +
                             std::to_string(q.level) + " has no two children");
    }
    a.children = true;
    a.left = level[2 * q.position];
    a.right = level[2 * q.position + 1];
    return a;
  }
  if (q.stage == protocol::DisputeStage::kDisputeReduction) {
    ML_ASSIGN_OR_RETURN(
        std::vector<std::vector<float>> chain,
        engine::ReductionChain(plan, static_cast<int64_t>(op), static_cast<int64_t>(q.tile),
                               static_cast<int64_t>(q.step) - 1, trace, batch));
    if (q.position >= chain.size()) {
      return InvalidArgument(where + ": block boundary " + std::to_string(q.position) +
                             " is past the tile's " + std::to_string(chain.size() - 1) + " blocks");
    }
    a.hash = engine::TileHash(chain[q.position]);
    return a;
  }
  return InvalidArgument(where + ": stage " + std::string(protocol::DisputeStageName(q.stage)) +
                         " is not answered from a step's trace");
}

void TokenOpsOpaque(engine::TilePlan* plan, const std::string& why) {
  if (!plan->tokens) return;
  for (engine::TileOp& op : plan->ops) {
    const bool reads_tokens =
        op.kind == engine::TileOpKind::kTileOpEmbedding ||
        op.kind == engine::TileOpKind::kTileOpLoss ||
        op.kind == engine::TileOpKind::kTileOpLossGrad ||
        (op.kind == engine::TileOpKind::kTileOpEmbeddingGrad && op.conv.at(1) == 1);
    if (!reads_tokens) continue;
    op.kind = engine::TileOpKind::kTileOpOpaque;
    op.opaque = why;
  }
}

void SetTilePhase(const engine::TilePlan& plan, protocol::DisputeConfig* config) {
  config->operator_tiles.clear();
  config->operator_blocks.clear();
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    const engine::TileOp& op = plan.ops[j];
    const bool state =
        op.kind == engine::TileOpKind::kTileOpState || op.kind == engine::TileOpKind::kTileOpOpaque;
    config->operator_tiles.push_back(state ? 0 : static_cast<uint64_t>(op.grid.count()));
    config->operator_blocks.push_back(
        static_cast<uint32_t>(engine::ReductionBlocks(plan, static_cast<int64_t>(j))));
  }
}

Result<Hash256> RuleTile(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                         const TileWitness& w) {
  const engine::TilePlan& plan = ctx.plan;
  const uint32_t j = task.operator_index;
  const std::string where = "tile rule (step " + std::to_string(task.step) + ", operator " +
                            std::to_string(j) + ", tile " + std::to_string(task.tile_index) + ")";
  // The task must be a tile of a computed operator of this plan, in the plan's own shape.
  if (!task.tile || task.whole_step || task.segment) {
    return FailedPrecondition(where + ": the referee task is not one tile");
  }
  if (task.step == 0) return FailedPrecondition(where + ": step 0 is the unit's start");
  if (j == 0 || j > plan.ops.size()) {
    return FailedPrecondition(where + ": the step has " + std::to_string(plan.ops.size()) +
                              " operators");
  }
  const int64_t op = static_cast<int64_t>(j) - 1;
  const engine::TileOp& target = plan.ops[static_cast<size_t>(op)];
  if (task.tile_count != static_cast<uint64_t>(target.grid.count()) ||
      task.tile_index >= task.tile_count) {
    return FailedPrecondition(where + ": " + target.name + " has " +
                              std::to_string(target.grid.count()) + " tiles; the task says " +
                              std::to_string(task.tile_count));
  }
  const int64_t blocks = engine::ReductionBlocks(plan, op);
  if (static_cast<int64_t>(task.reduction_blocks) != blocks ||
      (blocks > 0 && task.block >= task.reduction_blocks) || (blocks == 0 && task.block != 0)) {
    return FailedPrecondition(where + ": " + target.name + " has " + std::to_string(blocks) +
                              " reduction blocks; the task says block " +
                              std::to_string(task.block) + " of " +
                              std::to_string(task.reduction_blocks));
  }
  // 1. The earlier outputs: they must chain from the agreed state to the agreed C_{j-1}.
  if (w.outputs.size() != static_cast<size_t>(op)) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.outputs.size()) +
                           " operator outputs; the agreed ones are operators 1.." +
                           std::to_string(op));
  }
  Hash256 chain = task.state_input;
  for (const Hash256& out : w.outputs) chain = protocol::OperatorChainHash(chain, out);
  if (chain != task.input) {
    return InvalidArgument(where + ": the witness's operator outputs chain to " + chain.ShortHex() +
                           ", not to the agreed C_" + std::to_string(op) + " " +
                           task.input.ShortHex());
  }
  // 2. The input tiles: exactly the footprint's, each of an agreed operator, each proven.
  ML_ASSIGN_OR_RETURN(engine::TileFootprint fp,
                      engine::Footprint(plan, op, static_cast<int64_t>(task.tile_index),
                                        static_cast<int64_t>(task.block)));
  for (size_t i = 0; i < w.tiles.size(); ++i) {
    if (w.tiles[i].op == 0 || w.tiles[i].op >= j) {
      return InvalidArgument(where + ": input tile " + std::to_string(i) + " is of operator " +
                             std::to_string(w.tiles[i].op) +
                             ", whose output is not agreed (the agreed operators are 1.." +
                             std::to_string(op) + ")");
    }
  }
  if (w.tiles.size() != fp.tiles.size()) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.tiles.size()) +
                           " input tiles; the footprint of " + target.name + " has " +
                           std::to_string(fp.tiles.size()));
  }
  engine::TileInputs in;
  for (size_t i = 0; i < fp.tiles.size(); ++i) {
    const TileWitnessTile& t = w.tiles[i];
    const engine::TileRef& want = fp.tiles[i];
    const engine::TileOp& src = plan.ops[static_cast<size_t>(want.op)];
    if (t.op != static_cast<uint32_t>(want.op + 1) || t.tile != static_cast<uint64_t>(want.tile)) {
      return InvalidArgument(where + ": input tile " + std::to_string(i) + " is tile " +
                             std::to_string(t.tile) + " of operator " + std::to_string(t.op) +
                             "; the footprint needs tile " + std::to_string(want.tile) +
                             " of operator " + std::to_string(want.op + 1) + " (" + src.name + ")");
    }
    if (t.proof.index != t.tile || t.proof.leaf_count != static_cast<uint64_t>(src.grid.count()) ||
        !MerkleVerify(w.outputs[static_cast<size_t>(want.op)], engine::TileHash(t.values),
                      t.proof)) {
      return InvalidArgument(where + ": input tile " + std::to_string(t.tile) + " of operator " +
                             std::to_string(t.op) + " (" + src.name +
                             ") is not proven against its agreed output root " +
                             w.outputs[static_cast<size_t>(want.op)].ShortHex());
    }
    in.tiles.push_back(t.values);
  }
  // The batch's draws (BatchIndices, a token task's WindowStarts) allocate a row of the task's
  // batch size, which the plan carries: a batch larger than any a task trains on is refused before
  // any is drawn.
  if (!fp.batch_rows.empty() && (plan.batch < 1 || plan.batch > engine::kMaxBatchSize)) {
    return FailedPrecondition(where + ": the task's batch of " + std::to_string(plan.batch) +
                              " rows is outside 1.." + std::to_string(engine::kMaxBatchSize) +
                              " (engine::kMaxBatchSize, train.batch_size's range); the ledger "
                              "draws no batch of it");
  }
  // 3. The examples: the batch's, at the footprint's rows, proven against the data root; a token
  // task's tokens and targets: from the pages holding them, each proven against the data root.
  // A task whose examples are chunked carries them in `chunked`, any other in `examples`.
  const bool chunked = !plan.tokens && engine::ExampleChunks(plan.input_size) > 0;
  if (!chunked && !w.chunked.empty()) {
    return InvalidArgument(where + ": the witness has chunked examples; the task's examples (" +
                           std::to_string(plan.input_size) + " floats) are read whole");
  }
  // Each chunked example becomes a row of input_size floats below, which the witness does not
  // bound: the rows are refused before they are built when they would pass kMaxTileExampleBytes.
  if (chunked && !fp.batch_rows.empty() &&
      static_cast<uint64_t>(plan.input_size) >
          kMaxTileExampleBytes / sizeof(float) / fp.batch_rows.size()) {
    return InvalidArgument(where + ": the tile reads " + std::to_string(fp.batch_rows.size()) +
                           " examples of " + std::to_string(plan.input_size) +
                           " floats, more than the kMaxTileExampleBytes (" +
                           std::to_string(kMaxTileExampleBytes) +
                           ") of examples the ledger builds for one tile");
  }
  if (plan.tokens) {
    ML_RETURN_IF_ERROR(TileRuleTokens(ctx, task, fp, w, where, &in));
  } else if (chunked && (!w.examples.empty() || w.chunked.size() != fp.batch_rows.size())) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.chunked.size()) +
                           " chunked examples and " + std::to_string(w.examples.size()) +
                           " whole ones; the footprint reads batch rows " +
                           std::to_string(fp.batch_rows.size()) + ", chunked");
  } else if (!chunked && w.examples.size() != fp.batch_rows.size()) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.examples.size()) +
                           " examples; the footprint reads batch rows " +
                           std::to_string(fp.batch_rows.size()));
  }
  if (!plan.tokens && !w.pages.empty()) {
    return InvalidArgument(where + ": the witness has token pages; the task reads examples");
  }
  if (!plan.tokens && !fp.batch_rows.empty()) {
    const std::vector<int64_t> indices =
        engine::BatchIndices(ctx.seed, ctx.stream, static_cast<int64_t>(ctx.num_examples),
                             plan.batch, static_cast<int64_t>(task.step) - 1);
    for (size_t i = 0; i < fp.batch_rows.size(); ++i) {
      const int64_t row = fp.batch_rows[i];
      const uint64_t want = static_cast<uint64_t>(indices[static_cast<size_t>(row)]);
      const uint64_t index = chunked ? w.chunked[i].index : w.examples[i].index;
      if (index != want) {
        return InvalidArgument(where + ": example " + std::to_string(i) + " is dataset index " +
                               std::to_string(index) + "; batch row " + std::to_string(row) +
                               " draws index " + std::to_string(want));
      }
      if (chunked) {
        ML_RETURN_IF_ERROR(TileRuleChunkedExample(ctx, fp, w.chunked[i], i, where, &in));
        continue;
      }
      const StepWitnessExample& e = w.examples[i];
      if (e.proof.index != e.index || e.proof.leaf_count != ctx.num_examples ||
          !MerkleVerify(ctx.data_root, engine::ExampleLeaf(e.index, e.x, e.y), e.proof)) {
        return InvalidArgument(where + ": example " + std::to_string(i) + " (index " +
                               std::to_string(e.index) + ") is not proven against the data root " +
                               ctx.data_root.ShortHex());
      }
      in.x.push_back(e.x);
      in.y.push_back(e.y);
    }
  }
  // 4. The partial sum the block continues from: the agreed one.
  if (blocks > 0 && task.block > 0) {
    if (engine::TileHash(w.partial) != task.partial_input) {
      return InvalidArgument(where + ": the witness's partial sum S_" + std::to_string(task.block) +
                             " hashes to " + engine::TileHash(w.partial).ShortHex() +
                             ", the agreed one is " + task.partial_input.ShortHex());
    }
    in.partial = w.partial;
  } else if (!w.partial.empty()) {
    return InvalidArgument(where + ": block 0 starts from zeros; leave the partial sum empty");
  }
  Result<std::vector<float>> out = engine::RecomputeTile(
      plan, op, static_cast<int64_t>(task.tile_index), static_cast<int64_t>(task.block),
      static_cast<int64_t>(task.step) - 1, in);
  if (!out.ok()) return InvalidArgument(where + ": " + out.status().message());
  const Hash256 h = engine::TileHash(*out);
  const bool whole = blocks == 0 || static_cast<int64_t>(task.block) + 1 == blocks;
  return whole ? MerkleLeafHash(h) : h;
}

bool RulesFromRoots(const engine::TilePlan& plan, const protocol::RefereeTask& task) {
  if (!task.whole_step || task.tile || task.segment) return false;
  if (task.roots == protocol::RefereeRoots::kRootsChainEnd) return true;
  return task.roots == protocol::RefereeRoots::kRootsOperator && task.operator_index > 0 &&
         task.operator_index <= plan.ops.size() &&
         plan.ops[task.operator_index - 1].kind == engine::TileOpKind::kTileOpState;
}

Result<Hash256> RuleRoots(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                          const TileWitness& w) {
  const engine::TilePlan& plan = ctx.plan;
  const std::string where = "roots rule (step " + std::to_string(task.step) + ")";
  if (task.roots == protocol::RefereeRoots::kRootsNone || !task.whole_step || task.tile ||
      task.segment) {
    return FailedPrecondition(where + ": the referee task is not a whole step ruled from roots");
  }
  if (task.step == 0) return FailedPrecondition(where + ": step 0 is the unit's start");
  const size_t n = plan.ops.size();
  const size_t k = StateOperators(plan);
  if (k == 0 || 2 * k > n) {
    return FailedPrecondition(where + ": the plan's " + std::to_string(n) + " operators hold " +
                              std::to_string(k) + " input-state operators");
  }
  if (!RulesFromRoots(plan, task)) {
    const uint32_t j = task.operator_index;
    return FailedPrecondition(
        where + ": operator " + std::to_string(j) +
        (j == 0 || j > n ? " is not one of the step's " + std::to_string(n)
                         : " (" + plan.ops[j - 1].name +
                               ") is computed by the step without a footprint, not of its "
                               "input state") +
        "; the whole step decides (RefereeStep for a task with a data root over examples, else "
        "the genesis referee's RuleDispute)");
  }
  if (!w.tiles.empty() || !w.examples.empty() || !w.chunked.empty() || !w.pages.empty() ||
      !w.partial.empty()) {
    return InvalidArgument(where + ": a roots witness holds operator output roots only; it has " +
                           std::to_string(w.tiles.size()) + " tiles, " +
                           std::to_string(w.examples.size() + w.chunked.size()) + " examples, " +
                           std::to_string(w.pages.size()) + " token pages and a partial sum of " +
                           std::to_string(w.partial.size()));
  }
  if (task.roots == protocol::RefereeRoots::kRootsChainEnd) {
    if (w.outputs.size() != n) {
      return InvalidArgument(where + ": the witness has " + std::to_string(w.outputs.size()) +
                             " operator output roots; the agreed chain end C_" +
                             std::to_string(n) + " needs all " + std::to_string(n));
    }
    Hash256 chain = task.input;
    for (const Hash256& out : w.outputs) chain = protocol::OperatorChainHash(chain, out);
    if (chain != task.chain_end) {
      return InvalidArgument(where + ": the witness's operator outputs chain to " +
                             chain.ShortHex() + ", not to the agreed C_" + std::to_string(n) +
                             " " + task.chain_end.ShortHex());
    }
    // The step leaves the tensors it started from, in the same order, as its last k operators.
    for (size_t i = 0; i < k; ++i) {
      if ("in." + plan.ops[n - k + i].name != plan.ops[i].name) {
        return FailedPrecondition(where + ": operator " + std::to_string(n - k + i + 1) + " (" +
                                  plan.ops[n - k + i].name + ") is not the state tensor " +
                                  plan.ops[i].name + " after the step");
      }
    }
    return engine::StateHashOfRoots(static_cast<int64_t>(task.step), ctx.seed, ctx.stream,
                                    std::span<const Hash256>(w.outputs).subspan(n - k));
  }
  if (w.outputs.size() != k) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.outputs.size()) +
                           " operator output roots; the input state has " + std::to_string(k) +
                           " tensors");
  }
  const Hash256 state = engine::StateHashOfRoots(static_cast<int64_t>(task.step) - 1, ctx.seed,
                                                 ctx.stream, w.outputs);
  if (state != task.input) {
    return InvalidArgument(where + ": the witness's " + std::to_string(k) +
                           " tensor roots give the state hash " + state.ShortHex() +
                           ", not the agreed input state " + task.input.ShortHex());
  }
  return protocol::OperatorChainHash(task.operator_input, w.outputs[task.operator_index - 1]);
}

}  // namespace meshlearn::ledger

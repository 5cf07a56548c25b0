#include "meshlearn/ledger/chain.h"

#include "execute.h"
#include "meshlearn/base/merkle.h"
#include "ledger_state.h"
#include "store.h"

namespace meshlearn::ledger {

namespace {

// Encoded transactions in one block stay under half the block limit, leaving room for receipts.
constexpr size_t kMaxBlockTxBytes = kMaxBlockBytes / 2;

std::string BlockName(uint64_t h) { return "block " + std::to_string(h); }

}  // namespace

Chain::Chain(Genesis genesis, std::unique_ptr<Store> store, std::unique_ptr<LedgerState> state)
    : genesis_(std::move(genesis)),
      genesis_hash_(GenesisHash(genesis_)),
      store_(std::move(store)),
      state_(std::move(state)) {}

Chain::~Chain() = default;

Result<std::unique_ptr<Chain>> Chain::Open(const std::string& db_path, const Genesis& genesis) {
  return Open(Env::Default(), db_path, genesis);
}

Result<std::unique_ptr<Chain>> Chain::Open(Env* env, const std::string& db_path,
                                           const Genesis& genesis) {
  ML_RETURN_IF_ERROR(ValidateGenesis(genesis));
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(env, db_path));
  ML_ASSIGN_OR_RETURN(std::optional<StoredMeta> meta, store->ReadMeta());
  Hash256 gh = GenesisHash(genesis);
  auto state = std::make_unique<LedgerState>();
  StoredMeta head;
  if (!meta) {
    *state = LedgerState::FromGenesis(genesis);
    state->MarkAllDirty();
    head.genesis_hash = gh;
    head.height = 0;
    head.last_block_hash = gh;
    head.last_block_time = genesis.genesis_time_ms;
    head.state_hash = state->Hash();
    ML_RETURN_IF_ERROR(store->Commit(head, state.get(), nullptr, nullptr));
  } else {
    head = *meta;
    if (head.genesis_hash != gh) {
      return FailedPrecondition(db_path + ": ledger database was created from a different genesis (" +
                                head.genesis_hash.ToHex() + "); the given genesis hashes to " +
                                gh.ToHex() + "; use the network's genesis file or a new database");
    }
    ML_RETURN_IF_ERROR(store->LoadState(state.get()));
    Hash256 sh = state->Hash();
    if (sh != head.state_hash) {
      return DataLoss(db_path + ": stored state hashes to " + sh.ToHex() + " but height " +
                      std::to_string(head.height) + " recorded " + head.state_hash.ToHex());
    }
    if (head.height > 0) {
      ML_ASSIGN_OR_RETURN(Block last, store->GetBlock(head.height));
      if (last.header.state_hash != head.state_hash ||
          BlockHash(last.header) != head.last_block_hash) {
        return DataLoss(db_path + ": last block " + std::to_string(head.height) +
                        " does not match the recorded head");
      }
    }
  }
  std::unique_ptr<Chain> chain(new Chain(genesis, std::move(store), std::move(state)));
  chain->height_ = head.height;
  chain->last_block_hash_ = head.last_block_hash;
  chain->last_block_time_ms_ = head.last_block_time;
  chain->state_hash_ = head.state_hash;
  return chain;
}

Status Chain::CheckTx(const Transaction& tx) const {
  ML_RETURN_IF_ERROR(CheckAdmission(*state_, genesis_, PreparedTx(tx), /*exact_nonce=*/false));
  if (tx.fee > 0) {
    const Account* a = state_->accounts.Find(tx.sender);
    Amount balance = a ? a->balance : 0;
    if (balance < tx.fee) {
      return FailedPrecondition("insufficient funds for fee: need " + std::to_string(tx.fee) +
                                ", balance is " + std::to_string(balance));
    }
  }
  return Status::Ok();
}

Status Chain::CommitBlock(const Block& block, const std::vector<ByteSpan>& tx_wires) {
  Status s = state_->ComputeTotals().Check();
  if (!s.ok()) s = s.WithPrefix(BlockName(block.header.height));
  Bytes encoded;
  if (s.ok()) {
    encoded = EncodeBlockWithTxWires(block, tx_wires);
    if (encoded.size() > kMaxBlockBytes) {
      s = ResourceExhausted(BlockName(block.header.height) + " is too large to store");
    }
  }
  StoredMeta head;
  head.genesis_hash = genesis_hash_;
  head.height = block.header.height;
  head.last_block_hash = BlockHash(block.header);
  head.last_block_time = block.header.time_ms;
  head.state_hash = block.header.state_hash;
  if (s.ok()) s = store_->Commit(head, state_.get(), &block, &encoded);
  if (!s.ok()) {
    state_->RollbackTo(LedgerState::Mark{});
    state_->ClearJournal();
    return s;
  }
  state_->ClearJournal();
  height_ = head.height;
  last_block_hash_ = head.last_block_hash;
  last_block_time_ms_ = head.last_block_time;
  state_hash_ = head.state_hash;
  return Status::Ok();
}

Result<Block> Chain::ProduceBlock(std::vector<Transaction> txs, int64_t time_ms,
                                  const KeyPair& sequencer, std::vector<RejectedTx>* rejected,
                                  const std::function<Status(const Block&)>& before_commit) {
  if (!IsAuthorizedSequencer(genesis_, sequencer.public_key())) {
    return PermissionDenied("produce block: key " + sequencer.public_key().ToHex() +
                            " is not one of this chain's sequencers (genesis)");
  }
  if (time_ms < last_block_time_ms_) {
    return InvalidArgument("produce block: time " + std::to_string(time_ms) +
                           " ms is before the previous block's " +
                           std::to_string(last_block_time_ms_));
  }
  Block b;
  BlockHeader& h = b.header;
  h.chain_id = genesis_.chain_id;
  h.height = height_ + 1;
  h.prev_hash = last_block_hash_;
  h.time_ms = time_ms;
  h.sequencer = sequencer.public_key();
  size_t bytes = 0;
  std::vector<Hash256> ids;
  // Prepared transactions keep their encodings for the store; `txs` is not touched again, so
  // the references inside stay valid (the block gets copies).
  std::vector<PreparedTx> included;
  included.reserve(txs.size());
  for (const Transaction& tx : txs) {
    PreparedTx p(tx);
    Status adm = Status::Ok();
    if (b.txs.size() >= kMaxTxsPerBlock || bytes + p.wire.size() > kMaxBlockTxBytes) {
      adm = ResourceExhausted("block is full; resubmit for the next block");
    }
    Receipt r;
    if (adm.ok()) {
      adm = ExecuteBlockTx(*state_, genesis_, h.height, time_ms, h.prev_hash, p,
                           static_cast<uint32_t>(b.txs.size()), &r);
    }
    if (!adm.ok()) {
      if (rejected) rejected->push_back({p.id, adm});
      continue;
    }
    bytes += p.wire.size();
    ids.push_back(p.id);
    b.txs.push_back(tx);
    b.receipts.push_back(std::move(r));
    included.push_back(std::move(p));
  }
  EndBlock(*state_, genesis_, h.height, h.prev_hash);  // network training (network.cc)
  h.tx_root = MerkleRoot(ids);
  h.receipts_root = ReceiptsRoot(b.receipts);
  h.state_hash = state_->Hash();
  b.signature = sequencer.Sign(BlockHash(h).span());
  std::vector<ByteSpan> wires;
  wires.reserve(included.size());
  for (const PreparedTx& p : included) wires.push_back(p.wire);
  if (before_commit) {
    if (Status s = before_commit(b); !s.ok()) {
      state_->RollbackTo(LedgerState::Mark{});
      state_->ClearJournal();
      return s;
    }
  }
  ML_RETURN_IF_ERROR(CommitBlock(b, wires));
  return b;
}

Status Chain::ApplyBlock(const Block& block, const PublicKey& expected_sequencer) {
  const BlockHeader& h = block.header;
  std::string name = BlockName(h.height);
  if (h.chain_id != genesis_.chain_id) {
    return InvalidArgument(name + ": chain id '" + h.chain_id + "', expected '" +
                           genesis_.chain_id + "'");
  }
  if (h.height != height_ + 1) {
    return InvalidArgument(name + ": expected height " + std::to_string(height_ + 1));
  }
  if (h.prev_hash != last_block_hash_) {
    return InvalidArgument(name + ": previous hash " + h.prev_hash.ToHex() +
                           " does not match our last block " + last_block_hash_.ToHex());
  }
  if (h.time_ms < last_block_time_ms_) {
    return InvalidArgument(name + ": time goes backwards");
  }
  if (!IsAuthorizedSequencer(genesis_, h.sequencer)) {
    return PermissionDenied(name + ": signed by " + h.sequencer.ToHex() +
                            ", which is not a sequencer key of this chain's genesis");
  }
  if (h.sequencer != expected_sequencer) {
    return PermissionDenied(name + ": signed by " + h.sequencer.ToHex() +
                            ", not by the expected sequencer " + expected_sequencer.ToHex());
  }
  if (!VerifyBlockSignature(block)) {
    return PermissionDenied(name + ": the sequencer's signature does not verify");
  }
  if (block.txs.size() != block.receipts.size() || block.txs.size() > kMaxTxsPerBlock) {
    return InvalidArgument(name + ": malformed (transaction and receipt counts)");
  }
  std::vector<PreparedTx> prepared;
  std::vector<Hash256> ids;
  prepared.reserve(block.txs.size());
  ids.reserve(block.txs.size());
  for (const Transaction& tx : block.txs) {
    prepared.emplace_back(tx);
    ids.push_back(prepared.back().id);
  }
  if (MerkleRoot(ids) != h.tx_root) {
    return InvalidArgument(name + ": transaction root does not match its transactions");
  }
  std::vector<Receipt> receipts;
  receipts.reserve(block.txs.size());
  Status refused = Status::Ok();
  for (uint32_t i = 0; i < block.txs.size() && refused.ok(); ++i) {
    Receipt r;
    Status adm =
        ExecuteBlockTx(*state_, genesis_, h.height, h.time_ms, h.prev_hash, prepared[i], i, &r);
    if (!adm.ok()) {
      refused = InvalidArgument(name + ": transaction " + std::to_string(i) +
                                " is not admissible: " + adm.ToString());
    }
    receipts.push_back(std::move(r));
  }
  if (refused.ok()) EndBlock(*state_, genesis_, h.height, h.prev_hash);  // network.cc
  if (refused.ok() && ReceiptsRoot(receipts) != h.receipts_root) {
    refused = InvalidArgument(name + ": receipts differ from our execution (receipts root " +
                              ReceiptsRoot(receipts).ToHex() + ", block says " +
                              h.receipts_root.ToHex() + ")");
  }
  if (refused.ok() && receipts != block.receipts) {
    refused = InvalidArgument(name + ": receipts carried in the block differ from its root");
  }
  if (refused.ok()) {
    Hash256 sh = state_->Hash();
    if (sh != h.state_hash) {
      refused = InvalidArgument(name + ": state hash after execution is " + sh.ToHex() +
                                ", block says " + h.state_hash.ToHex());
    }
  }
  if (!refused.ok()) {
    state_->RollbackTo(LedgerState::Mark{});
    state_->ClearJournal();
    return refused;
  }
  std::vector<ByteSpan> wires;
  wires.reserve(prepared.size());
  for (const PreparedTx& p : prepared) wires.push_back(p.wire);
  return CommitBlock(block, wires);
}

Result<Block> Chain::GetBlock(uint64_t height) const {
  if (height == 0 || height > height_) {
    return NotFound("block " + std::to_string(height) + " does not exist (height is " +
                    std::to_string(height_) + ")");
  }
  return store_->GetBlock(height);
}

Result<Account> Chain::GetAccount(const PublicKey& key) const {
  const Account* a = state_->accounts.Find(key);
  if (a == nullptr) return NotFound("account " + key.ToHex() + " not found");
  return *a;
}

uint64_t Chain::NextNonce(const PublicKey& key) const {
  const Account* a = state_->accounts.Find(key);
  return a ? a->nonce : 0;
}

Result<TxRecord> Chain::TxAt(uint64_t height, uint32_t index) const {
  ML_ASSIGN_OR_RETURN(Block b, store_->GetBlock(height));
  if (index >= b.txs.size()) {
    return DataLoss("ledger store: index points past the transactions of block " +
                    std::to_string(height));
  }
  return TxRecord{std::move(b.txs[index]), std::move(b.receipts[index])};
}

Result<TxRecord> Chain::GetTransaction(const Hash256& tx_id) const {
  // The index is keyed by an id prefix: take the candidate whose receipt has the full id.
  ML_ASSIGN_OR_RETURN(auto candidates, store_->FindTxCandidates(tx_id));
  for (const auto& [height, index] : candidates) {
    ML_ASSIGN_OR_RETURN(TxRecord rec, TxAt(height, index));
    if (rec.receipt.tx_id == tx_id) return rec;
  }
  return NotFound("transaction " + tx_id.ToHex() + " not found");
}

Result<Receipt> Chain::GetReceipt(const Hash256& tx_id) const {
  ML_ASSIGN_OR_RETURN(TxRecord rec, GetTransaction(tx_id));
  return rec.receipt;
}

Result<NodeRecord> Chain::GetNode(const PublicKey& node_id) const {
  const NodeRecord* n = state_->nodes.Find(node_id);
  if (n == nullptr) return NotFound("node " + node_id.ToHex() + " not found");
  return *n;
}

template <typename Map, typename T>
static std::vector<T> Page(const Map& rows, uint64_t offset, uint64_t limit) {
  std::vector<T> out;
  if (offset >= rows.size()) return out;
  auto it = rows.begin();
  std::advance(it, static_cast<std::ptrdiff_t>(offset));
  for (; it != rows.end() && out.size() < limit; ++it) out.push_back(it->second);
  return out;
}

std::vector<NodeRecord> Chain::ListNodes(uint64_t offset, uint64_t limit) const {
  return Page<decltype(state_->nodes.rows()), NodeRecord>(state_->nodes.rows(), offset, limit);
}

Result<TaskRecord> Chain::GetTask(const Hash256& task_id) const {
  const TaskRecord* t = state_->tasks.Find(task_id);
  if (t == nullptr) return NotFound("task " + task_id.ToHex() + " not found");
  return *t;
}

std::vector<TaskRecord> Chain::ListTasks(uint64_t offset, uint64_t limit) const {
  return Page<decltype(state_->tasks.rows()), TaskRecord>(state_->tasks.rows(), offset, limit);
}

std::vector<WorkUnit> Chain::ListWorkUnits(const Hash256& task_id) const {
  std::vector<WorkUnit> out;
  const auto& rows = state_->units.rows();
  for (auto it = rows.lower_bound({task_id, 0}); it != rows.end() && it->first.first == task_id;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

Result<WorkUnit> Chain::GetWorkUnit(const Hash256& task_id, uint32_t index) const {
  const WorkUnit* u = state_->units.Find({task_id, index});
  if (u == nullptr) {
    return NotFound("unit " + std::to_string(index) + " of task " + task_id.ShortHex() +
                    " not found");
  }
  return *u;
}

std::vector<TxRecord> Chain::ListAccountTxs(const PublicKey& key, uint64_t offset,
                                            uint64_t limit) const {
  std::vector<TxRecord> out;
  auto where = store_->ListAccountTxs(key, offset, limit);
  if (!where.ok()) return out;
  std::optional<Block> cached;
  for (const auto& [height, index] : *where) {
    if (!cached || cached->header.height != height) {
      auto b = store_->GetBlock(height);
      if (!b.ok()) return out;
      cached = std::move(*b);
    }
    if (index < cached->txs.size()) out.push_back({cached->txs[index], cached->receipts[index]});
  }
  return out;
}

Totals Chain::GetTotals() const { return state_->ComputeTotals(); }

Status Chain::CheckInvariants() const { return state_->ComputeTotals().Check(); }

Status Chain::ReplayFromGenesis(Hash256* replayed) const {
  LedgerState s = LedgerState::FromGenesis(genesis_);
  Hash256 prev = genesis_hash_;
  for (uint64_t height = 1; height <= height_; ++height) {
    ML_ASSIGN_OR_RETURN(Block b, store_->GetBlock(height));
    const BlockHeader& h = b.header;
    if (h.prev_hash != prev) {
      return DataLoss("replay: block " + std::to_string(height) + " does not link to its parent");
    }
    for (uint32_t i = 0; i < b.txs.size(); ++i) {
      Receipt r;
      Status adm = ExecuteBlockTx(s, genesis_, h.height, h.time_ms, h.prev_hash,
                                  PreparedTx(b.txs[i]), i, &r);
      if (!adm.ok()) {
        return DataLoss("replay: block " + std::to_string(height) + " tx " + std::to_string(i) +
                        " is not admissible: " + adm.ToString());
      }
      if (r != b.receipts[i]) {
        return DataLoss("replay: block " + std::to_string(height) + " tx " + std::to_string(i) +
                        " gives a different receipt");
      }
    }
    EndBlock(s, genesis_, h.height, h.prev_hash);  // network training (network.cc)
    s.ClearJournal();
    s.ClearDirty();
    Hash256 sh = s.Hash();
    if (sh != h.state_hash) {
      return DataLoss("replay: state after block " + std::to_string(height) + " hashes to " +
                      sh.ToHex() + ", the block says " + h.state_hash.ToHex());
    }
    ML_RETURN_IF_ERROR(s.ComputeTotals().Check().WithPrefix("replay: block " +
                                                             std::to_string(height)));
    prev = BlockHash(h);
  }
  Hash256 final_hash = s.Hash();
  if (replayed) *replayed = final_hash;
  Hash256 live = state_->Hash();
  if (final_hash != live) {
    return DataLoss("replay from genesis gives state " + final_hash.ToHex() +
                    " but the live state is " + live.ToHex());
  }
  return Status::Ok();
}

}  // namespace meshlearn::ledger

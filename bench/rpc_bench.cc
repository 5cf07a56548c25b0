// Transactions per second end to end through the ledger's HTTP JSON-RPC API, on loopback.
//
//   rpc_bench [--txs N] [--clients C] [--block-interval-ms MS]
//
// Cases (one JSON line each):
//   inprocess_send_tx   send_tx straight into RpcService::HandleRpc from C threads, until all
//                       are committed (no HTTP): the baseline
//   http_chain_status   the cheapest call over HTTP: the transport's ceiling
//   http_send_tx        send_tx over HTTP, C clients in parallel, until all are committed
//                       (end to end: admission, block production, fsync'd commit)
// Each HTTP case prints its ratio to the in-process baseline measured in the same run.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/rpc_server.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"

using namespace meshlearn;
using namespace meshlearn::ledger;
using nlohmann::json;

namespace {

constexpr const char* kChainId = "meshlearn-bench";

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

KeyPair Key(int i) {
  KeySeed s;
  s.bytes.fill(0);
  std::memcpy(s.bytes.data(), &i, sizeof(i));
  s.bytes[31] = 0xb7;
  return KeyPair::FromSeed(s);
}

struct Ledger {
  Ledger(int clients, int64_t interval_ms) {
    char tmpl[] = "/tmp/meshlearn-rpc-bench-XXXXXX";
    dir = mkdtemp(tmpl);
    std::vector<PublicKey> keys;
    for (int i = 0; i < clients; ++i) {
      senders.push_back(Key(i));
      keys.push_back(senders.back().public_key());
    }
    Genesis g = DevnetGenesis(keys, 1'000'000'000'000, kChainId);
    g.block_interval_ms = interval_ms;
    KeyPair seq = Key(100000);
    g.sequencer = seq.public_key();
    chain = std::move(Chain::Open(dir + "/chain.db", g)).value();
    shared = std::make_unique<SharedChain>(chain.get());
    sequencer = std::make_unique<Sequencer>(shared.get(), seq, SystemClock::Default(),
                                            SequencerOptions{.max_mempool = 1'000'000, .max_nonce_gap = 1'000'000});
    rpc = std::make_unique<RpcService>(shared.get(), sequencer.get());
  }
  ~Ledger() { std::system(("rm -rf " + dir).c_str()); }
  std::string dir;
  std::vector<KeyPair> senders;
  std::unique_ptr<Chain> chain;
  std::unique_ptr<SharedChain> shared;
  std::unique_ptr<Sequencer> sequencer;
  std::unique_ptr<RpcService> rpc;
};

// Signed transfers, prepared before timing: the bench measures the ledger, not the client.
std::vector<std::vector<std::string>> PrepareTxs(const Ledger& l, int txs, uint64_t first_nonce) {
  std::vector<std::vector<std::string>> out(l.senders.size());
  for (int i = 0; i < txs; ++i) {
    size_t c = i % l.senders.size();
    const KeyPair& from = l.senders[c];
    const KeyPair& to = l.senders[(c + 1) % l.senders.size()];
    Transaction tx = BuildSignedTx(from, kChainId, first_nonce + out[c].size(),
                                   TransferTx{.to = to.public_key(), .amount = 1, .memo = ""});
    out[c].push_back(HexEncode(EncodeTx(tx)));
  }
  return out;
}

void WaitAllCommitted(Ledger& l, uint64_t nonce_target) {
  for (const KeyPair& k : l.senders) {
    for (;;) {
      uint64_t h = l.shared->height();
      if (l.shared->With([&](Chain& c) { return c.NextNonce(k.public_key()); }) >= nonce_target) break;
      l.shared->WaitAbove(h, 1000);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int txs = 20000;
  int clients = 4;
  int64_t interval_ms = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--txs") txs = std::atoi(argv[i + 1]);
    else if (a == "--clients") clients = std::atoi(argv[i + 1]);
    else if (a == "--block-interval-ms") interval_ms = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: rpc_bench [--txs N] [--clients C] [--block-interval-ms MS]\n");
      return 2;
    }
  }
  txs = std::max(txs, clients);
  Ledger l(clients, interval_ms);
  l.sequencer->Start();

  // Baseline: in-process admission of the same kind of transactions, then their commit.
  auto batch = PrepareTxs(l, txs, 0);
  double t0 = Now();
  std::atomic<int> failed{0};
  {
    std::vector<std::thread> ts;
    for (size_t c = 0; c < batch.size(); ++c) {
      ts.emplace_back([&, c] {
        for (const std::string& hex : batch[c]) {
          json r = l.rpc->HandleRpc({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "send_tx"}, {"params", {{"tx", hex}}}});
          if (!r.contains("result") && failed.fetch_add(1) == 0) {
            std::fprintf(stderr, "in-process send_tx failed: %s\n", r.dump().c_str());
          }
        }
      });
    }
    for (auto& t : ts) t.join();
  }
  if (failed.load() > 0) return 1;
  WaitAllCommitted(l, batch[0].size());
  double base = txs / (Now() - t0);
  std::printf("%s\n", json{{"bench", "rpc"}, {"case", "inprocess_send_tx"}, {"txs", txs},
                           {"block_interval_ms", interval_ms}, {"tx_per_s", base}}.dump().c_str());

  RpcServer server(l.rpc.get(), RpcServerOptions{.rate_limit = {.rate_per_second = 0}, .max_body_bytes = 1 << 20, .threads = 64});
  if (!server.Start("127.0.0.1", 0).ok()) return 1;

  // The transport's ceiling: chain_status from C clients.
  {
    int calls = txs;
    std::atomic<int> next{0};
    double s0 = Now();
    std::vector<std::thread> ts;
    for (int c = 0; c < clients; ++c) {
      ts.emplace_back([&] {
        RpcClient rpc(server.url());
        while (next.fetch_add(1) < calls) (void)rpc.Call("chain_status", json::object());
      });
    }
    for (auto& t : ts) t.join();
    double rate = calls / (Now() - s0);
    std::printf("%s\n", json{{"bench", "rpc"}, {"case", "http_chain_status"}, {"clients", clients},
                             {"req_per_s", rate}, {"ratio_vs_inprocess_send_tx", rate / base}}.dump().c_str());
  }

  // End to end over HTTP.
  uint64_t first = batch[0].size();
  batch = PrepareTxs(l, txs, first);
  double h0 = Now();
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < clients; ++c) {
    ts.emplace_back([&, c] {
      RpcClient rpc(server.url());
      for (const std::string& hex : batch[c]) {
        Result<json> r = rpc.Call("send_tx", {{"tx", hex}});
        if (!r.ok()) errors.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  double admitted = Now();
  WaitAllCommitted(l, first + batch[0].size());
  double e2e = txs / (Now() - h0);
  std::printf("%s\n", json{{"bench", "rpc"}, {"case", "http_send_tx"}, {"clients", clients}, {"txs", txs},
                           {"errors", errors.load()}, {"admit_per_s", txs / (admitted - h0)},
                           {"tx_per_s", e2e}, {"ratio_vs_inprocess_send_tx", e2e / base},
                           {"height", l.shared->height()}}.dump().c_str());
  server.Stop();
  l.sequencer->Stop();
  return errors.load() == 0 ? 0 : 1;
}

// meshlearn wallet balance|transfer|stake|unstake|withdraw|history|faucet|tx: an account's
// tokens on the ledger. Sending commands sign with a key from the key store, wait until the
// transaction's block is committed and print the receipt.
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/home_layout.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::cli {
namespace {

using ledger::Amount;
using nlohmann::json;

struct WalletArgs {
  std::string key;
  std::string rpc;
  std::string passphrase_file;
  std::string address;  // balance/history: a key name or hex, instead of --key
  std::string to;
  std::string node;
  std::string memo;
  std::string tx_id;
  Amount amount = 0;
  Amount fee = 0;
  int64_t timeout_s = 60;
  uint64_t limit = 20;
  uint64_t cursor = 0;
};

Result<PublicKey> ResolveAddress(const GlobalOptions& g, const std::string& who, std::string_view what) {
  if (who.size() == 2 * PublicKey::kSize) {
    Result<PublicKey> k = PublicKey::FromHex(who, what);
    if (k.ok()) return k;
  }
  KeyStore store(Env::Default(), g.KeysDir());
  Result<KeyInfo> info = store.Info(who);
  if (!info.ok()) {
    return InvalidArgument(std::string(what) + " '" + who +
                           "' is neither a public key (64 hex digits) nor a key in " + store.dir() +
                           " (see `meshlearn keys list`)");
  }
  return info->public_key;
}

// The account a read command is about: the positional address, else --key.
Result<PublicKey> SubjectOf(const GlobalOptions& g, const WalletArgs& a) {
  if (!a.address.empty()) return ResolveAddress(g, a.address, "address");
  if (!a.key.empty()) return ResolveAddress(g, a.key, "--key");
  return InvalidArgument("name the account: --key NAME or an address (64 hex digits)");
}

// REQUIRES: CheckReceipt(receipt) is OK.
std::string ShortJson(const json& receipt) {
  if (receipt.value("ok", false)) return "ok";
  return "FAILED: " + receipt.value("reason", std::string("no reason given"));
}

Status CheckReceipt(const json& receipt, const RpcWhere& where) {
  return CheckRpcAnswer(receipt, where,
                        {{"ok", JsonKind::kBool}, {"reason", JsonKind::kString},
                         {"height", JsonKind::kUnsigned}});
}

// A node id from what a user typed: a key name in the key store, a public key (64 hex digits), or
// any unique prefix of a registered node's id (list_nodes): `task audit` and the devnet print the
// first 12 digits.
Result<PublicKey> ResolveNode(const GlobalOptions& g, const WalletArgs& a) {
  Result<PublicKey> named = ResolveAddress(g, a.node, "node");
  if (named.ok() || a.node.size() == 2 * PublicKey::kSize || !CheckIdText("node id", a.node).ok()) {
    return named;
  }
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(
      std::string hex,
      ResolveIdPrefix("node", a.node, "on " + rpc.url(), [&](const IdVisitor& each) {
        return ForEachListedId(rpc, "list_nodes", json::object(), each);
      }));
  return PublicKey::FromHex(hex, "node id");
}

// Signs `payload` with --key, sends it and waits for its block; prints the receipt.
// The outbox holds, per key, the last signed transaction whose inclusion this command has not yet
// seen (it timed out). Re-running the same command finds it and resends the very same bytes
// (ed25519 signatures are deterministic, so "the same command" is "the same signed transaction at
// that nonce"), and the ledger includes a transaction at most once: a retry never pays twice. A
// command that saw its transaction included leaves no outbox entry, so sending the same transfer
// again on purpose is a new payment.
Result<std::optional<ledger::Transaction>> ReadOutbox(const std::string& path) {
  Env* env = Env::Default();
  if (!env->FileExists(path)) return std::optional<ledger::Transaction>();
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  Result<Bytes> bytes = HexDecode(text, path);
  Result<ledger::Transaction> tx = bytes.ok() ? ledger::DecodeTx(*bytes)
                                              : Result<ledger::Transaction>(bytes.status());
  if (!tx.ok()) {
    // A damaged outbox entry cannot be resent; drop it rather than block the key forever.
    std::cerr << "warning: ignoring unreadable " << path << ": " << tx.status().message() << "\n";
    ML_RETURN_IF_ERROR(env->DeleteFile(path));
    return std::optional<ledger::Transaction>();
  }
  return std::optional<ledger::Transaction>(std::move(*tx));
}

Status Send(GlobalOptions& g, const WalletArgs& a, ledger::TxPayload payload, const std::string& what) {
  if (a.key.empty()) return InvalidArgument("--key NAME is required: the key that signs and pays");
  KeyStore store(Env::Default(), g.KeysDir());
  ML_ASSIGN_OR_RETURN(std::string pass, ReadPassphrase(a.passphrase_file, false, !g.json));
  ML_ASSIGN_OR_RETURN(KeyPair kp, store.Load(a.key, pass));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(std::string chain_id, ledger::FetchChainId(rpc));
  ML_ASSIGN_OR_RETURN(uint64_t nonce, ledger::FetchNextNonce(rpc, kp.public_key()));

  // --home may be a node's data dir, possibly of the old layout (home_layout.h).
  ML_RETURN_IF_ERROR(MigrateHomeLayout(g.Home()));
  const std::string outbox = g.Home().WalletOutbox(a.key);
  ML_ASSIGN_OR_RETURN(std::optional<ledger::Transaction> pending, ReadOutbox(outbox));
  std::optional<ledger::Transaction> tx;
  if (pending) {
    ledger::Transaction same = ledger::BuildSignedTx(kp, chain_id, pending->nonce, payload, a.fee);
    if (ledger::TxId(same) == ledger::TxId(*pending)) {
      tx = std::move(*pending);  // the command that timed out, run again: resend, never re-pay
      if (!g.json) std::cerr << what << ": resending the earlier, unconfirmed transaction\n";
    } else if (pending->nonce >= nonce) {
      return FailedPrecondition(
          "key '" + a.key + "' has an unconfirmed transaction " + ledger::TxId(*pending).ToHex() +
          " (nonce " + std::to_string(pending->nonce) + ") from an earlier command that timed "
          "out; re-run that command to resend it, or check it with `meshlearn wallet tx ID`; "
          "delete " + outbox + " to abandon it");
    } else {
      ML_RETURN_IF_ERROR(Env::Default()->DeleteFile(outbox));  // included or superseded
    }
  }
  const bool fresh = !tx.has_value();  // signed by this command, not resent from the outbox
  if (!tx) tx = ledger::BuildSignedTx(kp, chain_id, nonce, payload, a.fee);
  std::string id;
  auto progress = [&](int64_t waited_ms) {
    if (!g.json && waited_ms >= 2000) {
      std::cerr << "  waiting for the next block... " << waited_ms / 1000 << "s" << std::endl;
    }
  };
  // Writes the outbox entry, then sends and waits.
  auto send = [&]() -> Result<json> {
    ML_RETURN_IF_ERROR(Env::Default()->CreateDirs(g.Home().OutboxDir(), 0700));
    ML_RETURN_IF_ERROR(
        Env::Default()->WriteFileAtomic(outbox, HexEncode(ledger::EncodeTx(*tx)) + "\n", 0600));
    id = ledger::TxId(*tx).ToHex();
    if (!g.json) {
      std::cerr << what << ": sent tx " << id.substr(0, 12) << " (nonce " << tx->nonce << ")"
                << std::endl;
    }
    try {
      return ledger::SendTxAndWait(rpc, *tx, a.timeout_s * 1000, progress);
    } catch (const json::exception& e) {
      // An answer of the wrong shape says nothing about the transaction: it stays in the outbox,
      // as after a timeout, and re-running the command resends the same bytes.
      return MalformedAnswer({rpc.url(), "send_tx"}, e.what());
    }
  };
  Result<json> sent = send();
  // On a replicated chain (several --rpc endpoints) the nonce may have been read from a standby
  // that applies the leader's blocks a poll later: just after a failover it can give a nonce the
  // chain already used, and the leader refuses the transaction outright. A transaction this
  // command signed (never one resent from the outbox) is then signed again with the nonce the
  // chain has moved to, once a read shows it (within about 2 s).
  for (int poll = 0; fresh && rpc.endpoint_count() > 1 && !sent.ok() &&
                     sent.status().code() == StatusCode::kInvalidArgument && poll < 20;
       ++poll) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ML_ASSIGN_OR_RETURN(uint64_t now, ledger::FetchNextNonce(rpc, kp.public_key()));
    if (now <= tx->nonce) continue;
    tx = ledger::BuildSignedTx(kp, chain_id, now, payload, a.fee);
    sent = send();
  }
  if (!sent.ok()) {
    if (sent.status().code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceeded(sent.status().message() +
                              ". Re-running this same command resends the same signed "
                              "transaction, so it is included at most once");
    }
    if (sent.status().code() != StatusCode::kUnavailable) {
      // The ledger refused it outright (it will never be included): nothing to resend.
      (void)Env::Default()->DeleteFile(outbox);
    }
    return sent.status();
  }
  const json done = *sent;
  const RpcWhere where{rpc.url(), "get_tx"};
  // Checked before the outbox entry is dropped: after a malformed answer, re-running the command
  // resends the same signed transaction (never a second one with a fresh nonce).
  ML_RETURN_IF_ERROR(CheckRpcAnswer(done, where,
                                    {{"receipt", JsonKind::kObject, /*required=*/true},
                                     {"height", JsonKind::kUnsigned}}));
  const json& receipt = done["receipt"];
  ML_RETURN_IF_ERROR(CheckReceipt(receipt, {rpc.url(), "get_tx (receipt)"}));
  ML_RETURN_IF_ERROR(Env::Default()->DeleteFile(outbox));
  g.Output(done, [&] {
    std::cout << what << " included in block " << done.value("height", uint64_t{0}) << ": "
              << ShortJson(receipt) << "\ntx: " << id << "\n";
  });
  if (!receipt.value("ok", false)) {
    g.exit_code = 1;  // the receipt (printed above) says why
  }
  return Status::Ok();
}

Status RunBalance(GlobalOptions& g, const WalletArgs& a) {
  ML_ASSIGN_OR_RETURN(PublicKey who, SubjectOf(g, a));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(json acct, rpc.Call("get_account", {{"address", who.ToHex()}}));
  const RpcWhere where{rpc.url(), "get_account"};
  ML_RETURN_IF_ERROR(CheckRpcAnswer(acct, where,
                                    {{"balance", JsonKind::kUnsigned, true},
                                     {"nonce", JsonKind::kUnsigned, true},
                                     {"unbonding", JsonKind::kArray},
                                     {"exists", JsonKind::kBool}}));
  // A node's own key: what its work earned its owner and what it lost, by kind, as the ledger
  // records it on the node (get_node's earnings).
  Result<json> node = rpc.Call("get_node", {{"id", who.ToHex()}});
  if (!node.ok() && node.status().code() != StatusCode::kNotFound) return node.status();
  if (node.ok()) {
    const RpcWhere node_where{rpc.url(), "get_node"};
    ML_RETURN_IF_ERROR(CheckRpcAnswer(*node, node_where,
                                      {{"owner", JsonKind::kString, true},
                                       {"status", JsonKind::kString, true},
                                       {"stake", JsonKind::kUnsigned, true},
                                       {"earnings", JsonKind::kObject, true}}));
    const json& e = (*node)["earnings"];
    ML_RETURN_IF_ERROR(CheckRpcAnswer(e, {rpc.url(), "get_node (earnings)"},
                                      {{"units", JsonKind::kUnsigned, true},
                                       {"aggregation", JsonKind::kUnsigned, true},
                                       {"verification", JsonKind::kUnsigned, true},
                                       {"jackpot", JsonKind::kUnsigned, true},
                                       {"checks_paid", JsonKind::kUnsigned, true},
                                       {"jackpot_wins", JsonKind::kUnsigned, true},
                                       {"slashed", JsonKind::kUnsigned, true},
                                       {"clawed_back", JsonKind::kUnsigned, true}}));
    acct["node"] = {{"id", who.ToHex()},
                    {"owner", (*node)["owner"]},
                    {"status", (*node)["status"]},
                    {"stake", (*node)["stake"]},
                    {"earnings", e}};
  }
  g.Output(acct, [&] {
    std::cout << "account: " << who.ToHex() << "\nbalance: " << acct.value("balance", Amount{0})
              << "\nnonce:   " << acct.value("nonce", uint64_t{0}) << "\n";
    if (acct.contains("unbonding")) {
      for (const json& u : acct["unbonding"]) std::cout << "unbonding: " << u.dump() << "\n";
    }
    if (!acct.value("exists", true)) std::cout << "(the ledger has never seen this account)\n";
    if (acct.contains("node")) {
      const json& n = acct["node"];
      const json& e = n["earnings"];
      auto amount = [&](const char* k) { return std::to_string(e[k].get<Amount>()); };
      std::cout << "node:    " << n["status"].get<std::string>() << ", stake "
                << n["stake"].get<Amount>() << ", owner " << n["owner"].get<std::string>()
                << "\nearned:  units " << amount("units") << ", aggregation "
                << amount("aggregation") << ", verification " << amount("verification") << " ("
                << amount("checks_paid") << " checks), jackpot " << amount("jackpot") << " ("
                << amount("jackpot_wins") << " wins); before the treasury's cut\nlost:    "
                << amount("slashed") << " slashed, " << amount("clawed_back")
                << " clawed back\n";
    }
  });
  return Status::Ok();
}

Status RunHistory(GlobalOptions& g, const WalletArgs& a) {
  ML_ASSIGN_OR_RETURN(PublicKey who, SubjectOf(g, a));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(json page, rpc.Call("account_history", {{"address", who.ToHex()},
                                                              {"cursor", a.cursor},
                                                              {"limit", a.limit}}));
  ML_RETURN_IF_ERROR(CheckRpcAnswer(page, {rpc.url(), "account_history"},
                                    {{"items", JsonKind::kArray, true},
                                     {"next_cursor", JsonKind::kUnsigned, false, true}}));
  for (size_t i = 0; i < page["items"].size(); ++i) {
    const std::string at = "account_history (items[" + std::to_string(i) + "]";
    const json& t = page["items"][i];
    ML_RETURN_IF_ERROR(CheckRpcAnswer(t, {rpc.url(), at + ")"},
                                      {{"receipt", JsonKind::kObject},
                                       {"id", JsonKind::kString},
                                       {"type", JsonKind::kString},
                                       {"nonce", JsonKind::kUnsigned},
                                       {"payload", JsonKind::kObject}}));
    if (t.contains("receipt")) {
      ML_RETURN_IF_ERROR(CheckReceipt(t["receipt"], {rpc.url(), at + ".receipt)"}));
    }
  }
  g.Output(page, [&] {
    const json& items = page["items"];
    if (items.empty()) std::cout << "no transactions\n";
    for (const json& t : items) {
      const json r = t.value("receipt", json::object());
      const std::string id =
          t.contains("id") && t["id"].is_string() ? t["id"].get<std::string>() : "";
      std::cout << "block " << r.value("height", uint64_t{0}) << "  tx " << id.substr(0, 12) << "  "
                << t.value("type", std::string("?")) << "  nonce " << t.value("nonce", uint64_t{0})
                << "  " << t.value("payload", json::object()).dump() << "  " << ShortJson(r)
                << "\n";
    }
    if (page.contains("next_cursor") && !page["next_cursor"].is_null()) {
      std::cout << "more: --cursor " << page["next_cursor"] << "\n";
    }
  });
  return Status::Ok();
}

// The ledger looks a transaction up by its whole id only. A prefix (`wallet` commands print 12
// digits) is resolved among this wallet's own transactions: those still in the home's outbox
// (sent, not yet seen included) and those in the ledger's history of --key's account, or of every
// key in the key store when --key is not given.
Result<std::string> ResolveTxId(const GlobalOptions& g, const WalletArgs& a,
                                ledger::RpcClient& rpc) {
  ML_RETURN_IF_ERROR(CheckIdText("transaction id", a.tx_id));
  if (a.tx_id.size() == 64) return ResolveIdPrefix("transaction", a.tx_id, "", {});
  std::vector<std::pair<std::string, PublicKey>> accounts;
  if (!a.key.empty()) {
    ML_ASSIGN_OR_RETURN(PublicKey k, ResolveAddress(g, a.key, "--key"));
    accounts.emplace_back(a.key, k);
  } else {
    KeyStore store(Env::Default(), g.KeysDir());
    Result<KeyListing> keys = store.List();
    if (keys.ok()) {
      for (const KeyInfo& k : keys->keys) accounts.emplace_back(k.name, k.public_key);
    }
  }
  std::string names;
  for (const auto& [name, key] : accounts) names += (names.empty() ? "" : ", ") + name;
  const std::string where =
      "in " + g.Home().OutboxDir() + " or the history of " +
      (names.empty() ? std::string("no key") : (accounts.size() > 1 ? "keys " : "key ") + names) +
      " on " + rpc.url();
  Result<std::string> id =
      ResolveIdPrefix("transaction", a.tx_id, where, [&](const IdVisitor& each) -> Status {
        Env* env = Env::Default();
        if (env->FileExists(g.Home().OutboxDir())) {
          Result<std::vector<std::string>> files = env->ListDir(g.Home().OutboxDir());
          for (const std::string& f : files.ok() ? *files : std::vector<std::string>()) {
            if (f.size() < 3 || f.compare(f.size() - 3, 3, ".tx") != 0) continue;
            // Read only (ReadOutbox would drop a damaged entry: that is for the sending commands).
            Result<std::string> text = env->ReadFile(JoinPath(g.Home().OutboxDir(), f));
            if (!text.ok()) continue;
            while (!text->empty() && text->back() == '\n') text->pop_back();
            Result<Bytes> bytes = HexDecode(*text, f);
            Result<ledger::Transaction> tx =
                bytes.ok() ? ledger::DecodeTx(*bytes) : Result<ledger::Transaction>(bytes.status());
            if (tx.ok()) each(ledger::TxId(*tx).ToHex());
          }
        }
        for (const auto& [name, key] : accounts) {
          ML_RETURN_IF_ERROR(
              ForEachListedId(rpc, "account_history", {{"address", key.ToHex()}}, each));
        }
        return Status::Ok();
      });
  if (!id.ok() && id.status().code() == StatusCode::kNotFound) {
    return NotFound(id.status().message() +
                    "; a prefix is looked up among your own transactions (--key NAME picks the "
                    "account), the whole 64-digit id finds any");
  }
  return id;
}

Status RunTx(GlobalOptions& g, const WalletArgs& a) {
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(std::string id, ResolveTxId(g, a, rpc));
  ML_ASSIGN_OR_RETURN(json t, rpc.Call("get_tx", {{"id", id}}));
  g.Output(t, [&] { std::cout << t.dump(2) << "\n"; });
  return Status::Ok();
}

void AddCommon(CLI::App* cmd, WalletArgs& a, bool sends) {
  cmd->add_option("--key", a.key, sends ? "Key that signs and pays (see `meshlearn keys list`)"
                                        : "Key whose account to show");
  cmd->add_option("--rpc", a.rpc, "Ledger RPC URL (default $MESHLEARN_RPC or http://127.0.0.1:7700)");
  if (sends) {
    cmd->add_option("--passphrase-file", a.passphrase_file,
                    "Read the key's passphrase from this file (else $MESHLEARN_PASSPHRASE or a prompt)");
    cmd->add_option("--fee", a.fee, "Fee paid to the treasury")->capture_default_str();
    cmd->add_option("--timeout", a.timeout_s, "Seconds to wait for inclusion")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
  }
}

void AddWallet(CLI::App& root, GlobalOptions& g) {
  static WalletArgs a;
  CLI::App* w = root.add_subcommand("wallet", "Balances, transfers and stake on the ledger");
  w->require_subcommand(1);
  w->footer(
      "Examples:\n"
      "  meshlearn wallet faucet --key alice                 # devnets: mint test tokens\n"
      "  meshlearn wallet balance --key alice\n"
      "  meshlearn wallet transfer bob 250 --key alice --memo rent\n"
      "  meshlearn wallet stake NODE_ID 1000 --key alice\n"
      "  meshlearn wallet history --key alice --limit 10\n"
      "Sending waits until the block is committed and prints the receipt. Sending the same\n"
      "transaction again (e.g. after a timeout) never pays twice.");

  CLI::App* bal = w->add_subcommand("balance", "Show an account's balance and nonce");
  bal->add_option("address", a.address, "Key name or public key (default: --key)");
  AddCommon(bal, a, false);
  bal->footer("Examples:\n  meshlearn wallet balance --key alice\n  meshlearn --json wallet balance 3b6a27bc...");
  bal->callback([&g] { g.Exit(RunBalance(g, a)); });

  CLI::App* tr = w->add_subcommand("transfer", "Send tokens to another account");
  tr->add_option("to", a.to, "Recipient: key name or public key")->required();
  tr->add_option("amount", a.amount, "Amount in the smallest unit")->required();
  tr->add_option("--memo", a.memo, "Free text stored with the transfer");
  AddCommon(tr, a, true);
  tr->footer("Examples:\n  meshlearn wallet transfer bob 250 --key alice --memo \"thanks\"\n"
             "  meshlearn --json wallet transfer 3b6a27bc... 1000 --key alice --fee 1");
  tr->callback([&g] {
    Result<PublicKey> to = ResolveAddress(g, a.to, "recipient");
    if (!to.ok()) return g.Exit(to.status());
    g.Exit(Send(g, a, ledger::TransferTx{.to = *to, .amount = a.amount, .memo = a.memo}, "transfer"));
  });

  CLI::App* st = w->add_subcommand("stake", "Bond tokens onto a node you own");
  st->add_option("node", a.node,
                 "Node: its key name, its id, or a unique prefix of its id (as `task audit` "
                 "prints it)")
      ->required();
  st->add_option("amount", a.amount, "Amount to bond")->required();
  AddCommon(st, a, true);
  st->footer("Examples:\n  meshlearn wallet stake node1 1000 --key alice");
  st->callback([&g] {
    Result<PublicKey> node = ResolveNode(g, a);
    if (!node.ok()) return g.Exit(node.status());
    g.Exit(Send(g, a, ledger::StakeTx{.node_id = *node, .amount = a.amount}, "stake"));
  });

  CLI::App* un = w->add_subcommand("unstake", "Start unbonding stake from a node you own");
  un->add_option("node", a.node, "Node: its key name, its id, or a unique prefix of its id")
      ->required();
  un->add_option("amount", a.amount, "Amount to unbond")->required();
  AddCommon(un, a, true);
  un->footer("Examples:\n  meshlearn wallet unstake node1 500 --key alice\n"
             "The tokens become withdrawable after the chain's unbonding delay (`wallet withdraw`).");
  un->callback([&g] {
    Result<PublicKey> node = ResolveNode(g, a);
    if (!node.ok()) return g.Exit(node.status());
    g.Exit(Send(g, a, ledger::UnstakeTx{.node_id = *node, .amount = a.amount}, "unstake"));
  });

  CLI::App* wd = w->add_subcommand("withdraw", "Move matured unbonded stake to your balance");
  AddCommon(wd, a, true);
  wd->footer("Examples:\n  meshlearn wallet withdraw --key alice");
  wd->callback([&g] { g.Exit(Send(g, a, ledger::WithdrawTx{}, "withdraw")); });

  CLI::App* hi = w->add_subcommand("history", "List an account's transactions, newest first");
  hi->add_option("address", a.address, "Key name or public key (default: --key)");
  hi->add_option("--limit", a.limit, "Transactions per page (1-100)")->capture_default_str();
  hi->add_option("--cursor", a.cursor, "Where to continue (printed by the previous page)");
  AddCommon(hi, a, false);
  hi->footer("Examples:\n  meshlearn wallet history --key alice\n  meshlearn wallet history --key alice --cursor 20");
  hi->callback([&g] { g.Exit(RunHistory(g, a)); });

  CLI::App* fa = w->add_subcommand("faucet", "Mint test tokens to your account (devnet chains)");
  a.amount = 1'000'000;
  fa->add_option("amount", a.amount, "Amount to mint")->capture_default_str();
  AddCommon(fa, a, true);
  fa->footer("Examples:\n  meshlearn wallet faucet --key alice\n  meshlearn wallet faucet 5000 --key alice");
  fa->callback([&g] {
    if (a.key.empty()) return g.Exit(InvalidArgument("--key NAME is required: the account to fund"));
    Result<PublicKey> me = ResolveAddress(g, a.key, "--key");
    if (!me.ok()) return g.Exit(me.status());
    g.Exit(Send(g, a, ledger::FaucetTx{.recipient = *me, .amount = a.amount}, "faucet"));
  });

  CLI::App* tx = w->add_subcommand("tx", "Show a transaction's status and receipt");
  tx->add_option("id", a.tx_id,
                 "Transaction id: the 64 hex digits, or a unique prefix of one of your own "
                 "transactions (the 12 digits `wallet` commands print)")
      ->required();
  tx->add_option("--key", a.key,
                 "Look a prefix up in this key's account history (default: every key's)");
  tx->add_option("--rpc", a.rpc, "Ledger RPC URL");
  tx->footer(
      "Examples:\n  meshlearn wallet tx 78a88c4eecff\n"
      "  meshlearn wallet tx 78a88c4eecff --key alice\n"
      "  meshlearn --json wallet tx 78a88c4eecff0c5d...  # the whole id: any transaction\n"
      "A prefix is looked up among your own transactions (the home's outbox and the\n"
      "history of your keys' accounts); the ledger finds any transaction by its whole id.");
  tx->callback([&g] { g.Exit(RunTx(g, a)); });
}

}  // namespace

MESHLEARN_COMMAND(35, AddWallet);

}  // namespace meshlearn::cli

// meshlearn keys new|list|show|export|import: ed25519 identities for accounts and nodes.
#include <iostream>

#include "meshlearn/base/keyfile.h"
#include "meshlearn/cli.h"

namespace meshlearn::cli {
namespace {

struct KeysArgs {
  std::string name;
  std::string passphrase_file;
  std::string path;
  std::string import_name;
  bool no_passphrase = false;
};

nlohmann::json InfoJson(const KeyInfo& k, const std::string& path) {
  return {{"name", k.name},
          {"public_key", k.public_key.ToHex()},
          {"encrypted", k.encrypted},
          {"path", path}};
}

void AddKeys(CLI::App& root, GlobalOptions& g) {
  static KeysArgs a;
  CLI::App* keys = root.add_subcommand("keys", "Create, list, back up and restore keys");
  keys->require_subcommand(1);
  keys->footer(
      "Keys live in $MESHLEARN_HOME/keys (default ~/.meshlearn/keys), one file per key, mode 0600.\n"
      "Examples:\n"
      "  meshlearn keys new alice                      # prompts for an optional passphrase\n"
      "  MESHLEARN_PASSPHRASE=secret meshlearn keys new bob\n"
      "  meshlearn keys new node1 --no-passphrase\n"
      "  meshlearn keys new node2 --passphrase-file pass.txt\n"
      "  meshlearn keys list\n"
      "  meshlearn keys show alice\n"
      "  meshlearn keys export alice alice-backup.json\n"
      "  meshlearn keys import alice-backup.json --name alice2");

  CLI::App* create = keys->add_subcommand("new", "Create a key pair");
  create->add_option("name", a.name, "Key name (A-Z a-z 0-9 _ . -)")->required();
  create->add_option("--passphrase-file", a.passphrase_file,
                     "Read the passphrase from this file (else $MESHLEARN_PASSPHRASE or a prompt)");
  create->add_flag("--no-passphrase", a.no_passphrase, "Store the key unencrypted");
  create->callback([&g] {
    KeyStore store(Env::Default(), g.KeysDir());
    std::string pass;
    if (!a.no_passphrase) {
      Result<std::string> p = ReadPassphrase(a.passphrase_file, /*confirm=*/true, !g.json);
      if (!p.ok()) return g.Exit(p.status());
      pass = *p;
    }
    Result<KeyPair> kp = store.Create(a.name, pass);
    if (!kp.ok()) return g.Exit(kp.status());
    KeyInfo info{a.name, kp->public_key(), !pass.empty()};
    g.Output(InfoJson(info, store.PathOf(a.name)), [&] {
      std::cout << "created key '" << a.name << "' (" << (pass.empty() ? "unencrypted" : "encrypted")
                << ")\npublic key: " << info.public_key.ToHex() << "\nfile: "
                << store.PathOf(a.name) << "\nback it up with: meshlearn keys export " << a.name
                << " BACKUP.json\n";
    });
  });

  CLI::App* list = keys->add_subcommand("list", "List keys");
  list->callback([&g] {
    KeyStore store(Env::Default(), g.KeysDir());
    Result<KeyListing> listing = store.List();
    if (!listing.ok()) return g.Exit(listing.status());
    // Every readable key is listed; an unreadable file is one entry with its error (JSON: an
    // "error" field instead of "public_key"), so one bad file hides nothing else.
    nlohmann::json j = nlohmann::json::array();
    for (const KeyInfo& k : listing->keys) j.push_back(InfoJson(k, store.PathOf(k.name)));
    for (const KeyListing::Bad& b : listing->unreadable) {
      j.push_back({{"name", b.name}, {"path", b.path}, {"error", b.why.message()}});
    }
    g.Output(j, [&] {
      if (listing->keys.empty() && listing->unreadable.empty()) {
        std::cout << "no keys in " << store.dir() << "\n";
      }
      for (const KeyInfo& k : listing->keys) {
        std::cout << k.name << "  " << k.public_key.ToHex()
                  << (k.encrypted ? "  encrypted" : "  unencrypted") << "\n";
      }
      for (const KeyListing::Bad& b : listing->unreadable) {
        std::cout << b.name << "  UNREADABLE: " << b.why.message() << "\n";
      }
    });
    if (!listing->unreadable.empty() && !g.json) {
      std::cerr << "warning: " << listing->unreadable.size() << " key file(s) in " << store.dir()
                << " could not be read (listed above); restore them from a backup\n";
    }
  });

  CLI::App* show = keys->add_subcommand("show", "Show a key's public key");
  show->add_option("name", a.name, "Key name")->required();
  show->callback([&g] {
    KeyStore store(Env::Default(), g.KeysDir());
    Result<KeyInfo> info = store.Info(a.name);
    if (!info.ok()) return g.Exit(info.status());
    g.Output(InfoJson(*info, store.PathOf(a.name)), [&] {
      std::cout << "name:       " << info->name << "\npublic key: " << info->public_key.ToHex()
                << "\nencrypted:  " << (info->encrypted ? "yes" : "no")
                << "\nfile:       " << store.PathOf(a.name) << "\n";
    });
  });

  CLI::App* exp = keys->add_subcommand("export", "Write a backup of a key (still encrypted if it was)");
  exp->add_option("name", a.name, "Key name")->required();
  exp->add_option("file", a.path, "Backup file to write (must not exist)")->required();
  exp->callback([&g] {
    KeyStore store(Env::Default(), g.KeysDir());
    Status s = store.Export(a.name, a.path);
    if (!s.ok()) return g.Exit(s);
    g.Output({{"name", a.name}, {"backup", a.path}}, [&] {
      std::cout << "wrote backup of '" << a.name << "' to " << a.path
                << " (mode 0600); keep it somewhere safe\n";
    });
  });

  CLI::App* imp = keys->add_subcommand("import", "Restore a key from a backup");
  imp->add_option("file", a.path, "Backup file written by `keys export`")->required();
  imp->add_option("--name", a.import_name, "Store under this name (default: the name in the backup)");
  imp->add_option("--passphrase-file", a.passphrase_file,
                  "An encrypted backup's passphrase (else $MESHLEARN_PASSPHRASE or a prompt)");
  imp->footer(
      "The backup is checked in full before it is stored: an encrypted one is decrypted\n"
      "(give its passphrase), and a secret that does not match the public key is refused.\n"
      "Examples:\n"
      "  meshlearn keys import alice-backup.json --name alice-restored\n"
      "  meshlearn keys import node1-backup.json --passphrase-file pass.txt");
  imp->callback([&g] {
    KeyStore store(Env::Default(), g.KeysDir());
    std::string pass;
    if (Result<std::string> text = Env::Default()->ReadFile(a.path); text.ok()) {
      Result<KeyInfo> peek = InspectKeyFile(*text, a.path);
      if (peek.ok() && peek->encrypted) {
        Result<std::string> p = ReadPassphrase(a.passphrase_file, /*confirm=*/false, !g.json);
        if (!p.ok()) return g.Exit(p.status());
        pass = *p;
      }
    }
    Result<KeyInfo> info = store.Import(a.path, a.import_name, pass);
    if (!info.ok()) return g.Exit(info.status());
    g.Output(InfoJson(*info, store.PathOf(info->name)), [&] {
      std::cout << "imported key '" << info->name << "' (" << info->public_key.ToHex() << ")\n";
    });
  });
}

}  // namespace

MESHLEARN_COMMAND(10, AddKeys);

}  // namespace meshlearn::cli

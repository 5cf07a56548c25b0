// A text corpus of many files, named by a listing and pinned by a data root, so that two machines
// with different files refuse the task instead of training on different data.
//
// The listing is what `b2sum -l 256` prints (coreutils), one line per file, sorted by path in
// byte order (LC_ALL=C sort), paths relative to the corpus root:
//
//   c0ffee...<64 lowercase hex digits>  asyncio/__init__.py\n
//
// The corpus is the files' bytes concatenated in the listing's order, nothing between them. Its
// data root is BLAKE2b-256 of the listing file itself (`b2sum -l 256 LISTING`): the listing pins
// every file's content and the order, and the task file pins the listing. The parser is strict
// (exactly that line format, strictly sorted, no absolute paths, no "." or ".." components, no
// empty lines), so the listing's bytes and the (path, hash) list determine each other.
//
// Made by, e.g. (examples/python3.11-stdlib.files):
//   cd /usr/lib/python3.11 && dpkg -L libpython3.11-minimal libpython3.11-stdlib |
//     sed -n 's|^/usr/lib/python3.11/\(.*\.py\)$|\1|p' | grep -v -e '^test/' -e '/test/' -e
//     '/tests/' | LC_ALL=C sort | xargs b2sum -l 256 > LISTING
//
//   ML_ASSIGN_OR_RETURN(CorpusListing l, ParseCorpusListing(text, "x.files"));
//   ML_ASSIGN_OR_RETURN(std::string corpus, LoadCorpus(env, "/usr/lib/python3.11", l));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"

namespace meshlearn::engine {

struct CorpusFile {
  std::string path;  // relative to the corpus root
  Hash256 hash;      // BLAKE2b-256 of the file's bytes
};

struct CorpusListing {
  std::string name;  // the listing file, for messages
  std::vector<CorpusFile> files;
  Hash256 data_root;  // BLAKE2b-256 of the listing's bytes
};

// Parses and validates a listing (see the top of this file); errors name `name` and the line.
Result<CorpusListing> ParseCorpusListing(std::string_view text, const std::string& name);

// The total size of the listed files under `root` (every file must exist and be a regular file;
// the error names the missing one).
Result<uint64_t> CorpusSize(Env* env, const std::string& root, const CorpusListing& listing);

// Reads every listed file under `root`, checks its BLAKE2b-256 against the listing and returns
// the concatenation. A missing, unreadable or changed file is an error naming it (and, for a
// changed file, both hashes). `limit`: refuse a corpus larger than this many bytes.
Result<std::string> LoadCorpus(Env* env, const std::string& root, const CorpusListing& listing,
                               uint64_t limit = uint64_t{1} << 34);

}  // namespace meshlearn::engine

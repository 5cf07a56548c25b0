#include "meshlearn/engine/corpus.h"

namespace meshlearn::engine {
namespace {

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A relative path without empty, "." or ".." components and without control characters.
bool IsPlainRelativePath(std::string_view p) {
  if (p.empty() || p.front() == '/' || p.back() == '/') return false;
  for (char c : p) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
  }
  size_t start = 0;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    std::string_view part =
        p.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

}  // namespace

Result<CorpusListing> ParseCorpusListing(std::string_view text, const std::string& name) {
  CorpusListing out;
  out.name = name;
  out.data_root = Blake2b(text);
  if (text.empty()) return InvalidArgument(name + ": the listing names no files");
  if (text.back() != '\n') return InvalidArgument(name + ": the last line has no newline");
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    auto bad = [&](const std::string& what) {
      return InvalidArgument(name + ":" + std::to_string(line_no) + ": " + what +
                             " (expected `<64 hex digits of BLAKE2b-256>  <relative path>`, as "
                             "`b2sum -l 256` prints)");
    };
    if (line.size() < 67 || line.substr(64, 2) != "  ") return bad("malformed line");
    if (!IsLowerHex(line.substr(0, 64))) return bad("the hash is not 64 lowercase hex digits");
    std::string_view path = line.substr(66);
    if (!IsPlainRelativePath(path)) {
      return bad("'" + std::string(path) +
                 "' is not a plain relative path (no leading '/', '.', '..', empty parts, "
                 "backslashes or control characters)");
    }
    if (!out.files.empty() && !(out.files.back().path < path)) {
      return bad("'" + std::string(path) + "' comes after '" + out.files.back().path +
                 "': paths must be strictly sorted in byte order (LC_ALL=C sort) without "
                 "repeats");
    }
    Result<Hash256> h = Hash256::FromHex(line.substr(0, 64), "hash");
    if (!h.ok()) return bad(h.status().message());
    out.files.push_back({std::string(path), *h});
  }
  return out;
}

Result<uint64_t> CorpusSize(Env* env, const std::string& root, const CorpusListing& listing) {
  uint64_t total = 0;
  for (size_t i = 0; i < listing.files.size(); ++i) {
    const std::string path = JoinPath(root, listing.files[i].path);
    Result<uint64_t> size = env->FileSize(path);
    if (!size.ok()) {
      return Status(size.status().code(),
                    path + " (" + listing.name + " line " + std::to_string(i + 1) +
                        ") is missing or unreadable: " + size.status().message());
    }
    total += *size;
  }
  return total;
}

Result<std::string> LoadCorpus(Env* env, const std::string& root, const CorpusListing& listing,
                               uint64_t limit) {
  ML_ASSIGN_OR_RETURN(const uint64_t total, CorpusSize(env, root, listing));
  if (total > limit) {
    return ResourceExhausted(listing.name + ": the listed files are " + std::to_string(total) +
                             " bytes, more than the " + std::to_string(limit) + " allowed");
  }
  std::string corpus;
  corpus.reserve(total);
  for (size_t i = 0; i < listing.files.size(); ++i) {
    const CorpusFile& f = listing.files[i];
    const std::string path = JoinPath(root, f.path);
    const std::string where = " (" + listing.name + " line " + std::to_string(i + 1) + ")";
    Result<std::string> bytes = env->ReadFile(path);
    if (!bytes.ok()) {
      return Status(bytes.status().code(),
                    path + where + " is missing or unreadable: " + bytes.status().message());
    }
    const Hash256 h = Blake2b(*bytes);
    if (h != f.hash) {
      return DataLoss(path + where + " is not the file the listing names: its BLAKE2b-256 is " +
                      h.ToHex() + ", the listing says " + f.hash.ToHex() +
                      " (another version of the package that installs it?)");
    }
    corpus += *bytes;
  }
  return corpus;
}

}  // namespace meshlearn::engine

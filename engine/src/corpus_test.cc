// Text corpora named by a listing and pinned by a data root (corpus.h): the listing format, the
// root, a task that loads one, and the refusals when the files are not the ones the task names.
#include "meshlearn/engine/corpus.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "meshlearn/engine/train.h"

namespace meshlearn::engine {
namespace {

const std::string kSrc = MESHLEARN_SOURCE_DIR;

std::string Line(std::string_view content, const std::string& path) {
  return Blake2b(content).ToHex() + "  " + path + "\n";
}

// Three files under /corpus and their listing /task/c.files (sorted in byte order: 'B' < 'a').
struct Corpus {
  MemEnv env;
  std::string a, b, c, listing;
  Corpus() {
    // (Appended, not `std::string(n, c) + "..."`: GCC 12 warns falsely about that.)
    a.assign(600, 'x');
    a.append("def f():\n    return 1\n");
    b.assign(500, 'y');
    b.append("class B:\n    pass\n");
    c = "# deep\n";
    c.append(300, 'z');
    EXPECT_TRUE(env.CreateDirs("/corpus/pkg").ok());
    EXPECT_TRUE(env.CreateDirs("/task").ok());
    EXPECT_TRUE(env.WriteFileAtomic("/corpus/B.py", b).ok());
    EXPECT_TRUE(env.WriteFileAtomic("/corpus/a.py", a).ok());
    EXPECT_TRUE(env.WriteFileAtomic("/corpus/pkg/c.py", c).ok());
    listing = Line(b, "B.py") + Line(a, "a.py") + Line(c, "pkg/c.py");
    EXPECT_TRUE(env.WriteFileAtomic("/task/c.files", listing).ok());
  }
  std::string Task(const std::string& root_hex, const std::string& extra = "") const {
    return "[data]\nformat = \"text\"\nroot = \"/corpus\"\nfiles = \"c.files\"\ndata_root = \"" +
           root_hex + "\"\nval_fraction = 0.1\n" + extra +
           "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 1\nn_embd = 8\nblock_size = 16\n"
           "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n[train]\nsteps = 1\nbatch_size = 2\n";
  }
  Result<TaskData> Load(const std::string& toml) {
    Result<TaskSpec> t = TaskSpec::Parse(toml, "/task/t.toml", "/task");
    if (!t.ok()) return t.status();
    spec = *t;
    return LoadTaskData(&env, spec);
  }
  TaskSpec spec;
};

TEST(CorpusTest, TheDataRootIsB2sumOfTheListing) {
  // base's Blake2b is BLAKE2b-256 unkeyed: `printf abc | b2sum -l 256` prints this.
  EXPECT_EQ(Blake2b(std::string_view("abc")).ToHex(),
            "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  Corpus c;
  Result<CorpusListing> l = ParseCorpusListing(c.listing, "c.files");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->files.size(), 3u);
  EXPECT_EQ(l->files[0].path, "B.py");
  EXPECT_EQ(l->files[2].path, "pkg/c.py");
  EXPECT_EQ(l->data_root, Blake2b(c.listing));
}

TEST(CorpusTest, MalformedListingsAreRefusedNamingTheLine) {
  const std::string h = std::string(64, 'a');
  struct Case {
    std::string text, want;
  };
  for (const Case& k : std::vector<Case>{
           {"", "names no files"},
           {h + "  a.py", "no newline"},
           {h + " a.py\n", ":1: malformed line"},
           {std::string(64, 'A') + "  a.py\n", ":1: the hash is not 64 lowercase hex"},
           {h + "  b.py\n" + h + "  a.py\n", ":2: 'a.py' comes after 'b.py'"},
           {h + "  a.py\n" + h + "  a.py\n", ":2: 'a.py' comes after 'a.py'"},
           {h + "  /etc/passwd\n", "not a plain relative path"},
           {h + "  x/../../etc/passwd\n", "not a plain relative path"},
           {h + "  ./a.py\n", "not a plain relative path"},
           {h + "  a//b.py\n", "not a plain relative path"},
           {h + "  \\a.py\n", "not a plain relative path"},
       }) {
    Result<CorpusListing> l = ParseCorpusListing(k.text, "x.files");
    ASSERT_FALSE(l.ok()) << k.text;
    EXPECT_NE(l.status().message().find("x.files"), std::string::npos) << l.status().ToString();
    EXPECT_NE(l.status().message().find(k.want), std::string::npos)
        << "want '" << k.want << "' in: " << l.status().ToString();
  }
}

TEST(CorpusTest, ATaskLoadsTheFilesConcatenatedInListingOrder) {
  Corpus c;
  Result<TaskData> d = c.Load(c.Task(Blake2b(c.listing).ToHex()));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const std::string text = c.b + c.a + c.c;  // sorted by path in byte order
  EXPECT_EQ(d->data_root, Blake2b(c.listing));
  EXPECT_EQ(d->corpus_files, 3);
  EXPECT_EQ(d->corpus_bytes, static_cast<int64_t>(text.size()));
  const size_t n_val = static_cast<size_t>(static_cast<double>(text.size()) * 0.1);
  ASSERT_EQ(d->train_tokens.tokens.size() + d->val_tokens.tokens.size(), text.size());
  EXPECT_EQ(d->val_tokens.tokens.size(), n_val);  // the last 10% is validation
  CharVocab v = BuildCharVocab(text);
  EXPECT_EQ(d->vocab.chars, v.chars);
  EXPECT_EQ(c.spec.model.gpt.vocab_size, static_cast<int64_t>(v.chars.size()));
  std::vector<int32_t> all = EncodeChars(v, text);
  EXPECT_TRUE(std::equal(d->val_tokens.tokens.begin(), d->val_tokens.tokens.end(),
                         all.end() - static_cast<std::ptrdiff_t>(n_val)));
  EXPECT_TRUE(
      std::equal(d->train_tokens.tokens.begin(), d->train_tokens.tokens.end(), all.begin()));
}

TEST(CorpusTest, OtherFilesAreRefusedNamingTheFile) {
  const std::string pin = [] {
    Corpus c;
    return Blake2b(c.listing).ToHex();
  }();
  {  // a changed file: named, with both hashes
    Corpus c;
    ASSERT_TRUE(c.env.WriteFileAtomic("/corpus/a.py", c.a + "# edited\n").ok());
    Result<TaskData> d = c.Load(c.Task(pin));
    ASSERT_FALSE(d.ok());
    const std::string m = d.status().message();
    EXPECT_NE(m.find("/task/t.toml: data.root"), std::string::npos) << m;
    EXPECT_NE(m.find("/corpus/a.py (/task/c.files line 2) is not the file the listing names"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(Blake2b(c.a).ToHex()), std::string::npos) << m;
  }
  {  // a missing file
    Corpus c;
    ASSERT_TRUE(c.env.DeleteFile("/corpus/pkg/c.py").ok());
    Result<TaskData> d = c.Load(c.Task(pin));
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("/corpus/pkg/c.py (/task/c.files line 3) is missing"),
              std::string::npos)
        << d.status().ToString();
  }
  {  // an edited listing (here: a file dropped) no longer hashes to the pinned root
    Corpus c;
    const std::string fewer = Line(c.b, "B.py") + Line(c.a, "a.py");
    ASSERT_TRUE(c.env.WriteFileAtomic("/task/c.files", fewer).ok());
    Result<TaskData> d = c.Load(c.Task(pin));
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("data.data_root: the listing /task/c.files hashes to " +
                                        Blake2b(fewer).ToHex() + " but the task pins " + pin),
              std::string::npos)
        << d.status().ToString();
  }
  {  // a missing listing
    Corpus c;
    ASSERT_TRUE(c.env.DeleteFile("/task/c.files").ok());
    Result<TaskData> d = c.Load(c.Task(pin));
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("/task/t.toml: data.files"), std::string::npos)
        << d.status().ToString();
  }
}

TEST(CorpusTest, TaskKeysAreChecked) {
  Corpus c;
  const std::string pin = Blake2b(c.listing).ToHex();
  auto parse_error = [](const std::string& toml) {
    Result<TaskSpec> t = TaskSpec::Parse(toml, "t.toml", "/task");
    return t.ok() ? std::string("ok") : t.status().message();
  };
  EXPECT_NE(parse_error(c.Task(pin, "path = \"/x.txt\"\n")).find("not both"), std::string::npos);
  EXPECT_NE(parse_error(c.Task("abc")).find("data_root"), std::string::npos);
  std::string no_root = c.Task(pin);
  no_root.erase(no_root.find("root = \"/corpus\"\n"), 17);
  EXPECT_NE(parse_error(no_root).find("root"), std::string::npos) << parse_error(no_root);
  // The single-file text task is unchanged.
  ASSERT_TRUE(c.env.WriteFileAtomic("/task/one.txt", c.a + c.b).ok());
  std::string single = c.Task(pin);
  single.replace(single.find("root = "), single.find("val_fraction") - single.find("root = "),
                 "path = \"one.txt\"\n");
  Result<TaskData> d = c.Load(single);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->data_root.IsZero());
  EXPECT_EQ(d->train_tokens.tokens.size() + d->val_tokens.tokens.size(), (c.a + c.b).size());
}

// The example's corpus: the listing committed in examples/ hashes to the root code-gpt.toml pins,
// and, where Debian's libpython3.11-minimal and libpython3.11-stdlib are installed, loads.
TEST(CorpusTest, PythonStdlibCorpus) {
  Result<TaskSpec> t = TaskSpec::Load(Env::Default(), kSrc + "/examples/code-gpt.toml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Result<std::string> listing = Env::Default()->ReadFile(t->data.text_files);
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  Result<CorpusListing> l = ParseCorpusListing(*listing, t->data.text_files);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->data_root.ToHex(), t->data.data_root);
  EXPECT_EQ(l->files.size(), 512u);
  if (!std::filesystem::exists("/usr/lib/python3.11/asyncio/__init__.py")) {
    GTEST_SKIP() << "/usr/lib/python3.11 is not installed (Debian's libpython3.11-stdlib)";
  }
  Result<TaskData> d = LoadTaskData(Env::Default(), *t);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->corpus_files, 512);
  EXPECT_EQ(d->corpus_bytes, 10029809);
  EXPECT_EQ(d->vocab.chars.size(), 172u);
  EXPECT_EQ(t->model.gpt.vocab_size, 172);
}

}  // namespace
}  // namespace meshlearn::engine

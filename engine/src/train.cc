#include "meshlearn/engine/train.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "config_ranges.h"
#include "meshlearn/base/config.h"
#include "meshlearn/engine/corpus.h"
#include "meshlearn/engine/step_replay.h"

namespace meshlearn::engine {
namespace {

// Data paths are relative to the task file's folder `base`; "~/" is $HOME (docs/paths.md).
Result<DataSpec> ParseData(const ConfigFile& c, const std::string& base) {
  DataSpec d;
  ML_ASSIGN_OR_RETURN(d.format, c.GetEnum("format", {"idx", "npy", "text", "tokens"}));
  if (c.Has("init_weights")) {
    ML_ASSIGN_OR_RETURN(d.init_weights, c.GetString("init_weights"));
    if (d.init_weights.empty()) {
      return c.Error("init_weights",
                     "is empty; name a safetensors file of the model's weights "
                     "(meshlearn.torch.export writes one) or remove the key to "
                     "initialise from task.seed");
    }
    d.init_weights = ResolveInDir(base, d.init_weights);
  }
  if (d.format == "idx" || d.format == "npy") {
    const bool idx = d.format == "idx";
    const std::string x = idx ? "_images" : "_x", y = idx ? "_labels" : "_y";
    ML_ASSIGN_OR_RETURN(d.train_x, c.GetString("train" + x));
    ML_ASSIGN_OR_RETURN(d.train_y, c.GetString("train" + y));
    ML_ASSIGN_OR_RETURN(d.test_x, c.GetString("test" + x));
    ML_ASSIGN_OR_RETURN(d.test_y, c.GetString("test" + y));
    ML_ASSIGN_OR_RETURN(d.mean, c.GetDouble("mean", 0.0));
    ML_ASSIGN_OR_RETURN(d.std, c.GetDouble("std", 1.0, DRange(0, std::nullopt, true, false)));
    ML_RETURN_IF_ERROR(c.CheckKnownKeys({"format", "train" + x, "train" + y, "test" + x, "test" + y,
                                         "mean", "std", "init_weights"}));
    d.train_x = ResolveInDir(base, d.train_x);
    d.train_y = ResolveInDir(base, d.train_y);
    d.test_x = ResolveInDir(base, d.test_x);
    d.test_y = ResolveInDir(base, d.test_y);
  } else if (d.format == "text") {
    ML_ASSIGN_OR_RETURN(d.val_fraction,
                        c.GetDouble("val_fraction", 0.1, DRange(0, 0.5, true, false)));
    ML_RETURN_IF_ERROR(c.CheckKnownKeys(
        {"format", "path", "root", "files", "data_root", "val_fraction", "init_weights"}));
    if (c.Has("files") || c.Has("root") || c.Has("data_root")) {
      // A corpus of many files (corpus.h): all three keys, and no `path`.
      if (c.Has("path")) {
        return c.Error("path", "a text task names one file (path) or a corpus (root, files, "
                               "data_root), not both");
      }
      ML_ASSIGN_OR_RETURN(d.text_root, c.GetString("root"));
      ML_ASSIGN_OR_RETURN(d.text_files, c.GetString("files"));
      ML_ASSIGN_OR_RETURN(d.data_root, c.GetString("data_root"));
      if (!Hash256::FromHex(d.data_root, "data_root").ok()) {
        return c.Error("data_root", "must be 64 hex digits (b2sum -l 256 of the listing), got '" +
                                        d.data_root + "'");
      }
      d.text_root = ResolveInDir(base, d.text_root);
      d.text_files = ResolveInDir(base, d.text_files);
    } else {
      ML_ASSIGN_OR_RETURN(d.text_path, c.GetString("path"));
      d.text_path = ResolveInDir(base, d.text_path);
    }
  } else {
    ML_ASSIGN_OR_RETURN(d.train_tokens, c.GetString("train"));
    ML_ASSIGN_OR_RETURN(d.val_tokens, c.GetString("val"));
    ML_ASSIGN_OR_RETURN(d.vocab_size, c.GetInt("vocab_size", IRange(2, 65536)));
    ML_RETURN_IF_ERROR(c.CheckKnownKeys({"format", "train", "val", "vocab_size", "init_weights"}));
    d.train_tokens = ResolveInDir(base, d.train_tokens);
    d.val_tokens = ResolveInDir(base, d.val_tokens);
  }
  return d;
}

}  // namespace

Result<TaskSpec> TaskSpec::Parse(std::string_view toml, const std::string& name,
                                 const std::string& base_dir) {
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(toml, name));
  // [network] belongs to network tasks (node/network_task.h); local training ignores it.
  ML_RETURN_IF_ERROR(
      cfg.CheckKnownKeys({"task", "data", "model", "optimizer", "train", "network"}));
  TaskSpec t;
  t.path = name;
  if (cfg.Has("task")) {
    ML_ASSIGN_OR_RETURN(ConfigFile task, cfg.GetTable("task"));
    ML_RETURN_IF_ERROR(task.CheckKnownKeys({"name", "seed", "stream"}));
    ML_ASSIGN_OR_RETURN(t.name, task.GetString("name", ""));
    ML_ASSIGN_OR_RETURN(int64_t seed, task.GetInt("seed", 1, IRange(0, std::nullopt)));
    ML_ASSIGN_OR_RETURN(int64_t stream, task.GetInt("stream", 0, IRange(0, 0xffffffffLL)));
    t.seed = static_cast<uint64_t>(seed);
    t.stream = static_cast<uint64_t>(stream);
  }
  ML_ASSIGN_OR_RETURN(ConfigFile data, cfg.GetTable("data"));
  ML_ASSIGN_OR_RETURN(t.data, ParseData(data, base_dir));
  ML_ASSIGN_OR_RETURN(ConfigFile model, cfg.GetTable("model"));
  ML_ASSIGN_OR_RETURN(t.model, ModelSpec::FromConfig(model));
  ML_ASSIGN_OR_RETURN(ConfigFile opt, cfg.GetTable("optimizer"));
  ML_ASSIGN_OR_RETURN(t.optimizer, OptimizerSpec::FromConfig(opt));
  ML_ASSIGN_OR_RETURN(ConfigFile train, cfg.GetTable("train"));
  ML_RETURN_IF_ERROR(train.CheckKnownKeys(
      {"steps", "batch_size", "micro_batches", "seq_len", "eval_batch_size", "eval_batches"}));
  ML_ASSIGN_OR_RETURN(t.steps, train.GetInt("steps", IRange(0, int64_t{1} << 40)));
  ML_ASSIGN_OR_RETURN(t.batch_size, train.GetInt("batch_size", IRange(1, kMaxBatchSize)));
  ML_ASSIGN_OR_RETURN(t.micro_batches, train.GetInt("micro_batches", 1, IRange(1, 1 << 20)));
  if (t.batch_size % t.micro_batches != 0) {
    std::string divisors;
    for (int64_t d = 2; d < t.batch_size && divisors.size() < 24; ++d) {
      if (t.batch_size % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    }
    return train.Error("micro_batches",
                       "(" + std::to_string(t.micro_batches) + ") must divide train.batch_size (" +
                           std::to_string(t.batch_size) + "); use 1" +
                           (divisors.empty() ? "" : " or a divisor such as " + divisors) +
                           ", or change the batch size");
  }
  ML_ASSIGN_OR_RETURN(t.eval_batch_size, train.GetInt("eval_batch_size", 1000, IRange(1, 1 << 20)));
  ML_ASSIGN_OR_RETURN(t.eval_batches, train.GetInt("eval_batches", 8, IRange(1, 1 << 20)));
  const bool gpt = t.model.kind == "gpt";
  const bool token_data = t.data.format == "text" || t.data.format == "tokens";
  if (gpt != token_data) {
    return InvalidArgument(name + ": model.kind \"" + t.model.kind +
                           "\" does not fit data.format \"" + t.data.format +
                           "\" (GPT models train on text or tokens; sequential "
                           "models on idx or npy)");
  }
  if (gpt) {
    ML_ASSIGN_OR_RETURN(t.seq_len, train.GetInt("seq_len", t.model.gpt.block_size,
                                                IRange(1, t.model.gpt.block_size)));
    if (t.data.format == "tokens") {
      if (t.model.gpt.vocab_size == 0) t.model.gpt.vocab_size = t.data.vocab_size;
      if (t.model.gpt.vocab_size != t.data.vocab_size) {
        return InvalidArgument(
            name + ": model.vocab_size (" + std::to_string(t.model.gpt.vocab_size) +
            ") differs from data.vocab_size (" + std::to_string(t.data.vocab_size) + ")");
      }
    }
  } else if (train.Has("seq_len")) {
    return train.Error("seq_len", "only applies to GPT models; remove it");
  }
  t.optimizer.total_steps = t.steps;
  return t;
}

Result<TaskSpec> TaskSpec::Load(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  return Parse(text, path, DirName(path));
}

namespace {

// One data file of a task: the key that names it in the task file, and the path.
struct DataFile {
  std::string key;  // "data.train_images"
  std::string path;
};

// The files of the data format (without data.init_weights).
std::vector<DataFile> FormatDataFiles(const DataSpec& s) {
  if (s.format == "idx") {
    return {{"data.train_images", s.train_x}, {"data.train_labels", s.train_y},
            {"data.test_images", s.test_x}, {"data.test_labels", s.test_y}};
  }
  if (s.format == "npy") {
    return {{"data.train_x", s.train_x}, {"data.train_y", s.train_y},
            {"data.test_x", s.test_x}, {"data.test_y", s.test_y}};
  }
  if (s.format == "text" && !s.text_files.empty()) return {{"data.files", s.text_files}};
  if (s.format == "text") return {{"data.path", s.text_path}};
  return {{"data.train", s.train_tokens}, {"data.val", s.val_tokens}};
}

// Every file the task reads: the format's and data.init_weights.
std::vector<DataFile> DataFiles(const DataSpec& s) {
  std::vector<DataFile> files = FormatDataFiles(s);
  if (!s.init_weights.empty()) files.push_back({"data.init_weights", s.init_weights});
  return files;
}

// "/usr/share/datasets/fashion-mnist/..." comes from the Debian package dataset-fashion-mnist.
std::string FixFor(const std::string& path) {
  const std::string prefix = "/usr/share/datasets/";
  if (path.rfind(prefix, 0) == 0) {
    std::string name = path.substr(prefix.size());
    name = name.substr(0, name.find('/'));
    if (!name.empty()) return "install dataset-" + name + " or fix the path";
  }
  return "fix the path (a relative path is relative to the task file)";
}

// Every data file exists, is a regular file and is not larger than this machine can load: the
// errors name the task file and the key, and come before anything is read.
Status CheckDataFiles(Env* env, const TaskSpec& task) {
  std::string source;
  const uint64_t available = AvailableMemoryBytes(&source);
  for (const DataFile& f : DataFiles(task.data)) {
    const std::string where = task.path + ": " + f.key + ": ";
    Result<uint64_t> size = env->FileSize(f.path);
    if (!size.ok()) {
      std::string fix = size.status().code() == StatusCode::kNotFound
                            ? "; " + FixFor(f.path)
                            : "";
      std::string message = size.status().message();
      // "cannot stat P" reads as "cannot open P" to a user: it is the same thing.
      if (message.rfind("cannot stat ", 0) == 0) message = "cannot open " + message.substr(12);
      return Status(size.status().code(), where + message + fix);
    }
    // A file (gzip: its content, at most 4x here) must fit in memory with room to spare.
    if (*size > available / 2) {
      return ResourceExhausted(where + f.path + " is " + FormatBytes(static_cast<double>(*size)) +
                               ", more than this machine can load (" +
                               FormatBytes(static_cast<double>(available)) + " available, " +
                               source + ")");
    }
  }
  return Status::Ok();
}

// A loader's error, prefixed with the task file and the key of the file it names.
Status DataError(const TaskSpec& task, const Status& s) {
  if (s.message().rfind(task.path + ": ", 0) == 0) return s;
  for (const DataFile& f : DataFiles(task.data)) {
    if (!f.path.empty() && s.message().find(f.path) != std::string::npos) {
      return s.WithPrefix(task.path + ": " + f.key);
    }
  }
  return s.WithPrefix(task.path + ": data");
}

// A text corpus (corpus.h): the listing must hash to the task's data_root, every listed file must
// be there with its listed hash, and the whole must fit in memory. Errors name the key (data.files,
// data.data_root, data.root) and the file.
Result<std::string> LoadTextCorpus(Env* env, const TaskSpec& task, TaskData* d) {
  const DataSpec& s = task.data;
  const std::string where = task.path + ": ";
  ML_ASSIGN_OR_RETURN(std::string listing_text, env->ReadFile(s.text_files));
  Result<CorpusListing> listing = ParseCorpusListing(listing_text, s.text_files);
  if (!listing.ok()) return listing.status().WithPrefix(where + "data.files");
  ML_ASSIGN_OR_RETURN(const Hash256 pinned, Hash256::FromHex(s.data_root, "data.data_root"));
  if (listing->data_root != pinned) {
    return FailedPrecondition(
        where + "data.data_root: the listing " + s.text_files + " hashes to " +
        listing->data_root.ToHex() + " but the task pins " + pinned.ToHex() +
        "; this is not the corpus the task names (an edited listing, or a task written for "
        "other files)");
  }
  Result<uint64_t> size = CorpusSize(env, s.text_root, *listing);
  if (!size.ok()) return size.status().WithPrefix(where + "data.root");
  std::string source;
  const uint64_t available = AvailableMemoryBytes(&source);
  // The bytes, their int32 tokens and the train/validation copies: ~13 bytes per byte of text.
  if (*size > available / 16) {
    return ResourceExhausted(where + "data.files: the corpus is " +
                             FormatBytes(static_cast<double>(*size)) +
                             ", more than this machine can load (" +
                             FormatBytes(static_cast<double>(available)) + " available, " +
                             source + ")");
  }
  Result<std::string> text = LoadCorpus(env, s.text_root, *listing);
  if (!text.ok()) return text.status().WithPrefix(where + "data.root");
  d->data_root = listing->data_root;
  d->corpus_files = static_cast<int64_t>(listing->files.size());
  d->corpus_bytes = static_cast<int64_t>(text->size());
  return text;
}

// The text of a text task: its one file, or its corpus (LoadTextCorpus, which fills in d's corpus
// facts).
Result<std::string> ReadText(Env* env, const TaskSpec& task, TaskData* d) {
  if (!task.data.text_files.empty()) return LoadTextCorpus(env, task, d);
  return env->ReadFile(task.data.text_path);
}

}  // namespace

Status CheckTrainingMemory(const TaskSpec& task) {
  Result<MemoryEstimate> e = EstimateMemory(task.model, task.batch_size, task.seq_len,
                                            task.optimizer.kind, task.optimizer.momentum != 0);
  if (!e.ok()) return e.status().WithPrefix(task.path);
  std::string source;
  const uint64_t available = AvailableMemoryBytes(&source);
  if (e->total() <= static_cast<double>(available)) return Status::Ok();
  const bool activations = e->activations > e->parameters + e->gradients + e->optimizer;
  const std::string batch = "train.batch_size = " + std::to_string(task.batch_size);
  return ResourceExhausted(
      task.path + ": " + (activations ? batch : e->largest) + ": training needs about " +
      FormatBytes(e->total()) + " (weights " + FormatBytes(e->parameters) + ", gradients " +
      FormatBytes(e->gradients) + ", optimizer moments " + FormatBytes(e->optimizer) +
      ", activations at " + batch + " " + FormatBytes(e->activations) + ") but this machine has " +
      FormatBytes(static_cast<double>(available)) + " available (" + source + "); " +
      (activations ? "lower train.batch_size" : "make the model smaller"));
}

Result<std::string> LoadTaskText(Env* env, const TaskSpec& task) {
  if (task.data.format != "text") {
    return InvalidArgument(task.path + ": data.format is '" + task.data.format +
                           "', not text");
  }
  TaskData scratch;
  Result<std::string> text = ReadText(env, task, &scratch);
  if (!text.ok()) return DataError(task, text.status());
  return text;
}

Result<TaskData> LoadTaskData(Env* env, TaskSpec& task) {
  ML_RETURN_IF_ERROR(CheckDataFiles(env, task));
  Result<TaskData> d = LoadTaskDataUnchecked(env, task);
  if (!d.ok()) return DataError(task, d.status());
  if (!task.data.init_weights.empty()) {
    Result<SafetensorsFile> f = SafetensorsFile::Read(env, task.data.init_weights);
    if (!f.ok()) {
      return Status(f.status().code(),
                    task.path + ": data.init_weights: " + f.status().message() +
                        "; write the file again (meshlearn.torch.export, or a model file of "
                        "`meshlearn train`) or remove the key to initialise from task.seed");
    }
    d->init_weights = std::make_shared<const SafetensorsFile>(std::move(*f));
  }
  return d;
}

Status LoadInitWeights(const SafetensorsFile& file, const std::string& where, Model* model) {
  const std::string at = where + ": " + file.name() + ": ";
  const std::string fix =
      "; the weights must come from the task's own [model] (meshlearn.torch.export writes "
      "both from one module)";
  std::set<std::string> wanted;
  for (Param& p : model->params()) {
    wanted.insert(p.name);
    auto it = file.entries().find(p.name);
    if (it == file.entries().end()) {
      return InvalidArgument(at + "no tensor '" + p.name + "' (F32, shape " +
                             ShapeToString(p.value.shape()) + "), which the model needs" + fix);
    }
    const SafetensorsEntry& e = it->second;
    if (e.dtype != DType::kF32) {
      return InvalidArgument(at + "tensor '" + p.name + "' is " + std::string(DTypeName(e.dtype)) +
                             ", the model's is F32; write float32 weights (tensor.float())");
    }
    if (e.shape != p.value.shape()) {
      return InvalidArgument(at + "tensor '" + p.name + "' has shape " + ShapeToString(e.shape) +
                             ", the model's is " + ShapeToString(p.value.shape()) + fix);
    }
  }
  for (const auto& [name, e] : file.entries()) {
    if (!wanted.count(name)) {
      return InvalidArgument(at + "tensor '" + name + "' " + std::string(DTypeName(e.dtype)) + " " +
                             ShapeToString(e.shape) +
                             " is not a parameter of the model; remove it (a file of initial "
                             "weights holds the model's parameters and nothing else)" +
                             fix);
    }
  }
  // All checked: copy (nothing is changed on an error above).
  for (Param& p : model->params()) {
    const SafetensorsEntry& e = file.entries().at(p.name);
    float* dst = p.value.data();
    std::memcpy(dst, e.bytes.data(), e.bytes.size());
    for (int64_t i = 0; i < p.value.size(); ++i) {
      if (!std::isfinite(dst[i])) {
        return InvalidArgument(at + "tensor '" + p.name + "' holds a non-finite value (" +
                               std::to_string(dst[i]) + ") at element " + std::to_string(i) +
                               "; initial weights must be finite numbers");
      }
    }
  }
  return Status::Ok();
}

Result<TaskData> LoadTaskDataUnchecked(Env* env, TaskSpec& task) {
  TaskData d;
  const DataSpec& s = task.data;
  const float mean = static_cast<float>(s.mean), std = static_cast<float>(s.std);
  if (s.format == "idx" || s.format == "npy") {
    if (s.format == "idx") {
      ML_ASSIGN_OR_RETURN(d.train, LoadIdx(env, s.train_x, s.train_y, mean, std));
      ML_ASSIGN_OR_RETURN(d.test, LoadIdx(env, s.test_x, s.test_y, mean, std));
    } else {
      ML_ASSIGN_OR_RETURN(d.train, LoadNpyPair(env, s.train_x, s.train_y, mean, std));
      ML_ASSIGN_OR_RETURN(d.test, LoadNpyPair(env, s.test_x, s.test_y, mean, std));
    }
    Shape want = task.model.input;
    for (const ClassificationData* c : {&d.train, &d.test}) {
      Shape got(c->x.shape().begin() + 1, c->x.shape().end());
      if (NumElements(got) != NumElements(want)) {
        return InvalidArgument(task.path + ": model.input " + ShapeToString(want) +
                               " does not match the data's sample shape " + ShapeToString(got));
      }
    }
    // Reshape the samples to the model's input shape (same element count, row-major).
    for (ClassificationData* c : {&d.train, &d.test}) {
      Shape s2 = {c->size()};
      s2.insert(s2.end(), want.begin(), want.end());
      c->x = Tensor(s2, std::move(c->x.vec()));
    }
    ML_ASSIGN_OR_RETURN(const int64_t classes, ModelOutputs(task.model));
    for (const ClassificationData* c : {&d.train, &d.test}) {
      if (c->num_classes > classes) {
        return InvalidArgument(task.path + ": the data has labels up to " +
                               std::to_string(c->num_classes - 1) + " but the model outputs " +
                               std::to_string(classes) +
                               " classes; set the last linear layer's out to at least " +
                               std::to_string(c->num_classes));
      }
    }
    if (d.train.size() < 1) return InvalidArgument(s.train_x + ": no training samples");
    return d;
  }
  d.tokens = true;
  if (s.format == "text") {
    const std::string source =
        s.text_files.empty() ? s.text_path : "the corpus of " + s.text_files;  // for messages
    ML_ASSIGN_OR_RETURN(std::string text, ReadText(env, task, &d));
    if (text.size() < 1000) {
      return InvalidArgument(source + ": only " + std::to_string(text.size()) +
                             " bytes; a text task needs at least 1000");
    }
    d.vocab = BuildCharVocab(text);
    const int64_t V = static_cast<int64_t>(d.vocab.chars.size());
    if (task.model.gpt.vocab_size == 0) task.model.gpt.vocab_size = V;
    if (task.model.gpt.vocab_size < V) {
      return InvalidArgument(task.path + ": model.vocab_size " +
                             std::to_string(task.model.gpt.vocab_size) + " is smaller than the " +
                             std::to_string(V) + " distinct characters of " + source +
                             "; omit vocab_size to take it from the data");
    }
    std::vector<int32_t> all = EncodeChars(d.vocab, text);
    const size_t n_val = static_cast<size_t>(static_cast<double>(all.size()) * s.val_fraction);
    d.train_tokens.tokens.assign(all.begin(), all.end() - n_val);
    d.val_tokens.tokens.assign(all.end() - n_val, all.end());
    d.train_tokens.vocab_size = d.val_tokens.vocab_size = task.model.gpt.vocab_size;
  } else {
    ML_ASSIGN_OR_RETURN(d.train_tokens, LoadTokens(env, s.train_tokens, s.vocab_size));
    ML_ASSIGN_OR_RETURN(d.val_tokens, LoadTokens(env, s.val_tokens, s.vocab_size));
  }
  const int64_t T = task.seq_len;
  if (static_cast<int64_t>(d.train_tokens.tokens.size()) < T + 1 ||
      static_cast<int64_t>(d.val_tokens.tokens.size()) < T + 1) {
    return InvalidArgument(task.path +
                           ": the train and validation splits need at least seq_len + 1 = " +
                           std::to_string(T + 1) + " tokens each");
  }
  return d;
}

EvalResult Evaluate(Model& model, const TaskSpec& task, const TaskData& data) {
  EvalResult r;
  double loss_sum = 0;
  if (!data.tokens) {
    const ClassificationData& test = data.test;
    int64_t correct = 0;
    for (int64_t start = 0; start < test.size(); start += task.eval_batch_size) {
      const int64_t n = std::min(task.eval_batch_size, test.size() - start);
      std::vector<int64_t> idx(n);
      for (int64_t j = 0; j < n; ++j) idx[j] = start + j;
      Batch b = MakeClassificationBatch(test, idx);
      float loss = model.Forward(b, ForwardOptions{});
      loss_sum += static_cast<double>(loss) * static_cast<double>(n);
      TensorView lg = model.logits();
      std::vector<int32_t> pred = ArgmaxRows(lg.data(), n, lg.dim(1));
      for (int64_t j = 0; j < n; ++j) correct += pred[j] == b.targets[j];
    }
    r.samples = test.size();
    r.loss = loss_sum / static_cast<double>(r.samples);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.samples);
    return r;
  }
  const int64_t T = task.seq_len, B = task.batch_size;
  const int64_t n_windows = EvalWindowCount(task, data);
  for (int64_t w0 = 0; w0 < n_windows; w0 += B) {
    const int64_t n = std::min(B, n_windows - w0);
    Batch b = EvalWindows(task, data, w0, n);
    float loss = model.Forward(b, ForwardOptions{});
    loss_sum += static_cast<double>(loss) * static_cast<double>(n * T);
    r.samples += n * T;
  }
  r.loss = loss_sum / static_cast<double>(r.samples);
  return r;
}

int64_t EvalWindowCount(const TaskSpec& task, const TaskData& data) {
  return std::min<int64_t>((static_cast<int64_t>(data.val_tokens.tokens.size()) - 1) / task.seq_len,
                           task.eval_batches * task.batch_size);
}

Batch EvalWindows(const TaskSpec& task, const TaskData& data, int64_t first, int64_t count) {
  std::vector<int64_t> starts(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) starts[static_cast<size_t>(j)] = (first + j) * task.seq_len;
  return MakeTokenBatch(data.val_tokens, starts, task.seq_len);
}

Result<std::unique_ptr<Trainer>> Trainer::Create(Env* env, TaskSpec task) {
  // Before loading the data, when the model is complete (a GPT's vocabulary may come from it).
  if (task.model.kind != "gpt" || task.model.gpt.vocab_size >= 2) {
    ML_RETURN_IF_ERROR(CheckTrainingMemory(task));
  }
  ML_ASSIGN_OR_RETURN(TaskData data, LoadTaskData(env, task));
  return Create(std::move(task), std::move(data));
}

Result<std::unique_ptr<Trainer>> Trainer::Create(TaskSpec task, TaskData data) {
  return Create(std::move(task), std::make_shared<const TaskData>(std::move(data)));
}

Result<std::unique_ptr<Trainer>> Trainer::Create(TaskSpec task,
                                                 std::shared_ptr<const TaskData> data) {
  CHECK(data != nullptr);
  ML_RETURN_IF_ERROR(CheckTrainingMemory(task));
  std::unique_ptr<Trainer> t(new Trainer(std::move(task), std::move(data)));
  ML_ASSIGN_OR_RETURN(t->state_.model, Model::Create(t->task_.model));
  if (t->task_.data.init_weights.empty()) {
    t->state_.model->Init(t->task_.seed);
  } else {
    if (t->data_->init_weights == nullptr) {
      return FailedPrecondition(t->task_.path + ": data.init_weights (" +
                                t->task_.data.init_weights +
                                ") was not read; load the data with LoadTaskData");
    }
    ML_RETURN_IF_ERROR(LoadInitWeights(
        *t->data_->init_weights, t->task_.path + ": data.init_weights", t->state_.model.get()));
  }
  t->state_.optimizer = std::make_unique<Optimizer>(t->task_.optimizer, t->state_.model->params());
  t->state_.seed = t->task_.seed;
  t->state_.stream = t->task_.stream;
  t->stream_ = std::make_unique<DataStream>(t->task_, *t->data_, t->task_.stream);
  return t;
}

Status Trainer::Resume(TrainState st) {
  if (st.model->spec().ToJson() != task_.model.ToJson()) {
    return InvalidArgument("checkpoint model " + st.model->spec().ToJson() +
                           " differs from the task's model " + task_.model.ToJson());
  }
  if (!st.optimizer) return InvalidArgument("the file has no optimizer state (a model file?)");
  if (st.optimizer->spec().ToJson() != task_.optimizer.ToJson()) {
    return InvalidArgument("checkpoint optimizer " + st.optimizer->spec().ToJson() +
                           " differs from the task's optimizer " + task_.optimizer.ToJson());
  }
  if (st.seed != task_.seed || st.stream != task_.stream) {
    return InvalidArgument("checkpoint seed/stream " + std::to_string(st.seed) + "/" +
                           std::to_string(st.stream) + " differ from the task's " +
                           std::to_string(task_.seed) + "/" + std::to_string(task_.stream));
  }
  state_ = std::move(st);
  return Status::Ok();
}

int64_t SamplesPerStep(const TaskSpec& task) { return task.batch_size; }

int64_t Trainer::samples_per_step() const { return SamplesPerStep(task_); }

DataStream::DataStream(const TaskSpec& task, const TaskData& data, uint64_t stream)
    : data_(&data),
      seed_(task.seed),
      stream_(stream),
      batch_size_(task.batch_size),
      seq_len_(task.seq_len) {
  if (!data.tokens) {
    sampler_ = std::make_unique<BatchSampler>(seed_, stream_, data.train.size(), batch_size_);
  }
}

Batch DataStream::BatchForStep(int64_t step) {
  if (!data_->tokens) {
    return MakeClassificationBatch(data_->train, sampler_->Indices(step),
                                   std::exchange(spare_inputs_, Tensor()));
  }
  std::vector<int64_t> starts =
      WindowStarts(seed_, stream_, step, batch_size_,
                   static_cast<int64_t>(data_->train_tokens.tokens.size()), seq_len_);
  return MakeTokenBatch(data_->train_tokens, starts, seq_len_);
}

Batch Trainer::BatchForStep(int64_t step) { return stream_->BatchForStep(step); }

float Trainer::Step() {
  Batch b = BatchForStep(state_.step);
  const float loss = StepOn(b);
  stream_->Recycle(std::move(b));
  return loss;
}

float Trainer::StepOn(const Batch& batch) {
  return StepOnBatch(state_, batch, DropoutSeed(task_.seed, task_.stream), &last_grad_norm_,
                     task_.micro_batches);
}

std::vector<float> Trainer::FlatParams() const {
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(state_.model->NumParameters()));
  for (const Param& p : state_.model->params()) {
    flat.insert(flat.end(), p.value.data(), p.value.data() + p.value.size());
  }
  return flat;
}

Status SetFlatParams(Model& model, std::span<const float> params) {
  const int64_t n = model.NumParameters();
  if (static_cast<int64_t>(params.size()) != n) {
    return InvalidArgument("weights have " + std::to_string(params.size()) +
                           " values but the model has " + std::to_string(n) + " parameters");
  }
  size_t off = 0;
  for (Param& p : model.params()) {
    std::copy(params.begin() + static_cast<std::ptrdiff_t>(off),
              params.begin() + static_cast<std::ptrdiff_t>(off + p.value.size()), p.value.data());
    off += static_cast<size_t>(p.value.size());
  }
  return Status::Ok();
}

Status Trainer::SetFlatParams(std::span<const float> params) {
  return engine::SetFlatParams(*state_.model, params);
}

Result<MemoryEstimate> EstimateEvaluationMemory(const TaskSpec& task) {
  // Evaluate's batch: a GPT's forwards take batch_size windows, a classifier's eval_batch_size
  // samples (the last chunk may be smaller; the estimate is of the largest).
  const int64_t batch = task.model.kind == "gpt" ? task.batch_size : task.eval_batch_size;
  ML_ASSIGN_OR_RETURN(MemoryEstimate e,
                      EstimateMemory(task.model, batch, task.seq_len, /*optimizer_kind=*/"",
                                     /*sgd_momentum=*/false));
  e.gradients = 0;  // Model::CreateForEvaluation allocates none
  e.optimizer = 0;
  return e;
}

Result<std::unique_ptr<Evaluator>> Evaluator::Create(TaskSpec task,
                                                     std::shared_ptr<const TaskData> data) {
  CHECK(data != nullptr);
  std::unique_ptr<Evaluator> e(new Evaluator(std::move(task), std::move(data)));
  ML_ASSIGN_OR_RETURN(e->model_, Model::CreateForEvaluation(e->task_.model));
  return e;
}

Status Trainer::StartUnit(uint64_t stream, std::span<const float> params, double lr_scale) {
  if (!(lr_scale > 0.0 && lr_scale <= 1.0)) {
    return InvalidArgument("unit lr_scale must be in (0, 1], got " + std::to_string(lr_scale));
  }
  ML_RETURN_IF_ERROR(SetFlatParams(params));
  task_.stream = stream;
  state_.stream = stream;
  state_.step = 0;
  // A unit's inner rate is constant (lr x lr_scale), no warm-up: see UnitOptimizerSpec.
  state_.optimizer = std::make_unique<Optimizer>(UnitOptimizerSpec(task_.optimizer, lr_scale),
                                                 state_.model->params());
  stream_ = std::make_unique<DataStream>(task_, *data_, stream);
  return Status::Ok();
}

}  // namespace meshlearn::engine

#include "meshlearn/node/task_bundle.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include "meshlearn/base/config.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/step_witness.h"

namespace meshlearn::node {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The data path of `key` in a parsed DataSpec.
std::string* DataField(engine::DataSpec& d, const std::string& key) {
  if (key == kInitWeightsKey) return &d.init_weights;
  if (d.format == "idx") {
    if (key == "train_images") return &d.train_x;
    if (key == "train_labels") return &d.train_y;
    if (key == "test_images") return &d.test_x;
    if (key == "test_labels") return &d.test_y;
  } else if (d.format == "npy") {
    if (key == "train_x") return &d.train_x;
    if (key == "train_y") return &d.train_y;
    if (key == "test_x") return &d.test_x;
    if (key == "test_y") return &d.test_y;
  } else if (d.format == "text") {
    if (key == "path") return &d.text_path;
  } else if (d.format == "tokens") {
    if (key == "train") return &d.train_tokens;
    if (key == "val") return &d.val_tokens;
  }
  return nullptr;
}

Result<engine::TaskSpec> ParseBundleSpec(std::string_view text) {
  if (text.size() > kMaxBundleBytes) {
    return InvalidArgument("task bundle is " + std::to_string(text.size()) +
                           " bytes, over the limit " + std::to_string(kMaxBundleBytes));
  }
  // base_dir "": "blob:<hex>" paths are kept as they are.
  return engine::TaskSpec::Parse(text, "task bundle", "");
}

}  // namespace

std::vector<std::string> DataFileKeys(std::string_view format) {
  if (format == "idx") return {"train_images", "train_labels", "test_images", "test_labels"};
  if (format == "npy") return {"train_x", "train_y", "test_x", "test_y"};
  if (format == "text") return {"path"};
  if (format == "tokens") return {"train", "val"};
  return {};
}

std::vector<std::string> BundleFileKeys(const engine::DataSpec& data) {
  std::vector<std::string> keys = DataFileKeys(data.format);
  if (!data.init_weights.empty()) keys.push_back(kInitWeightsKey);
  return keys;
}

namespace {

// Rewrites the [data] table of `toml` line by line: edit(key) gives what replaces the line of
// `key` (std::nullopt: the line stays; "": the line goes), every other line stays as it is.
std::string EditDataLines(
    std::string_view toml,
    const std::function<std::optional<std::string>(const std::string& key)>& edit) {
  std::string out;
  out.reserve(toml.size() + 256);
  std::string table;
  size_t pos = 0;
  while (pos < toml.size()) {
    size_t nl = toml.find('\n', pos);
    size_t end = nl == std::string_view::npos ? toml.size() : nl;
    std::string_view line = toml.substr(pos, end - pos);
    std::string_view t = Trim(line);
    std::optional<std::string> replaced;
    if (!t.empty() && t.front() == '[') {
      size_t close = t.find(']');
      table = close == std::string_view::npos ? "" : std::string(Trim(t.substr(1, close - 1)));
      if (!table.empty() && table.front() == '[') table.clear();  // [[array]]
    } else if (table == "data") {
      size_t eq = t.find('=');
      if (eq != std::string_view::npos) replaced = edit(std::string(Trim(t.substr(0, eq))));
    }
    pos = end + 1;
    if (replaced && replaced->empty()) continue;  // dropped, with its newline
    out += replaced ? *replaced : std::string(line);
    if (nl != std::string_view::npos) out += '\n';
  }
  return out;
}

}  // namespace

Result<std::string> RewriteDataPaths(
    std::string_view toml, const std::vector<std::pair<std::string, std::string>>& replacements) {
  std::vector<bool> done(replacements.size(), false);
  Status twice = Status::Ok();
  std::string out = EditDataLines(toml, [&](const std::string& key) -> std::optional<std::string> {
    for (size_t i = 0; i < replacements.size(); ++i) {
      if (replacements[i].first != key) continue;
      if (done[i]) twice = InvalidArgument("data." + key + " appears twice");
      done[i] = true;
      return key + " = \"" + replacements[i].second + "\"";
    }
    return std::nullopt;
  });
  ML_RETURN_IF_ERROR(twice);
  for (size_t i = 0; i < replacements.size(); ++i) {
    if (!done[i]) {
      return InvalidArgument("could not find data." + replacements[i].first + " as a line `" +
                             replacements[i].first +
                             " = \"...\"` inside the [data] table; write it that way");
    }
  }
  return out;
}

Result<std::string> RewriteCorpusAsFile(std::string_view toml, const std::string& path) {
  int files = 0;
  std::string out = EditDataLines(toml, [&](const std::string& key) -> std::optional<std::string> {
    if (key == "files") {
      ++files;
      return "path = \"" + path + "\"";
    }
    if (key == "root" || key == "data_root") return std::string();
    return std::nullopt;
  });
  if (files != 1) {
    return InvalidArgument(
        "could not find data.files as one line `files = \"...\"` inside the [data] table; write "
        "it that way");
  }
  return out;
}

Result<TaskBundle> MakeBundle(Env* env, const std::string& task_path, net::BlobStore* store) {
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(task_path));
  ML_ASSIGN_OR_RETURN(engine::TaskSpec spec, engine::TaskSpec::Load(env, task_path));
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(text, task_path));
  ML_RETURN_IF_ERROR(NetworkSpec::FromConfig(cfg).status());

  TaskBundle bundle;
  std::vector<std::pair<std::string, std::string>> repl;
  if (spec.data.format == "text" && !spec.data.text_files.empty()) {
    // A corpus (engine/corpus.h) ships as one file of its text, the files concatenated in the
    // listing's order (checked against data_root): the tokens the nodes train on are the ones
    // this machine's corpus gives, and the bundle's blob id pins them as data_root pinned the
    // listing. data.path then names the blob (BundleFileKeys: "path").
    ML_ASSIGN_OR_RETURN(std::string corpus, engine::LoadTaskText(env, spec));
    ML_ASSIGN_OR_RETURN(net::BlobId id, store->Put(AsBytes(corpus)));
    ML_RETURN_IF_ERROR(store->Pin(id));
    const std::string blob = std::string(kBlobPathPrefix) + id.ToHex();
    ML_ASSIGN_OR_RETURN(text, RewriteCorpusAsFile(text, blob));
    bundle.files.push_back({"path", spec.data.text_files, id, corpus.size()});
  }
  for (const std::string& key : BundleFileKeys(spec.data)) {
    if (!bundle.files.empty() && bundle.files[0].key == key) continue;  // the corpus, above
    std::string* path = DataField(spec.data, key);
    if (path == nullptr || path->empty()) {
      return InvalidArgument(task_path + ": data." + key + " is empty");
    }
    Result<std::string> data = env->ReadFile(*path);
    if (!data.ok()) {
      return data.status().WithPrefix(task_path + ": data." + key + " (" + *path + ")");
    }
    ML_ASSIGN_OR_RETURN(net::BlobId id, store->Put(AsBytes(*data)));
    ML_RETURN_IF_ERROR(store->Pin(id));
    bundle.files.push_back({key, *path, id, data->size()});
    repl.emplace_back(key, std::string(kBlobPathPrefix) + id.ToHex());
  }
  ML_ASSIGN_OR_RETURN(bundle.text, RewriteDataPaths(text, repl));
  // The rewrite must give a bundle that parses to exactly those blobs.
  ML_ASSIGN_OR_RETURN(auto blobs, BundleDataBlobs(bundle.text));
  if (blobs.size() != bundle.files.size()) {
    return Internal("bundle rewrite lost a data file");
  }
  for (size_t i = 0; i < blobs.size(); ++i) {
    if (blobs[i].second != bundle.files[i].id) {
      return InvalidArgument(task_path + ": data." + blobs[i].first +
                             " could not be rewritten (is it written twice?)");
    }
  }
  ML_ASSIGN_OR_RETURN(bundle.id, store->Put(AsBytes(bundle.text)));
  ML_RETURN_IF_ERROR(store->Pin(bundle.id));
  return bundle;
}

Result<std::vector<std::pair<std::string, net::BlobId>>> BundleDataBlobs(std::string_view text) {
  ML_ASSIGN_OR_RETURN(engine::TaskSpec spec, ParseBundleSpec(text));
  std::vector<std::pair<std::string, net::BlobId>> out;
  for (const std::string& key : BundleFileKeys(spec.data)) {
    std::string* path = DataField(spec.data, key);
    std::string_view v = path ? std::string_view(*path) : std::string_view();
    if (!v.starts_with(kBlobPathPrefix)) {
      return InvalidArgument(
          "task bundle: data." + key + " is \"" + std::string(v.substr(0, 80)) +
          "\", expected \"blob:<64 hex digits>\" (bundles name data by blob id)");
    }
    Result<net::BlobId> id = net::BlobId::FromHex(v.substr(std::strlen(kBlobPathPrefix)));
    if (!id.ok()) return id.status().WithPrefix("task bundle: data." + key);
    out.emplace_back(key, *id);
  }
  return out;
}

Result<LoadedBundle> LoadBundle(std::string_view text, const BundleResolver& resolver) {
  ML_ASSIGN_OR_RETURN(engine::TaskSpec spec, ParseBundleSpec(text));
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(text, "task bundle"));
  LoadedBundle out;
  ML_ASSIGN_OR_RETURN(out.net, NetworkSpec::FromConfig(cfg));
  ML_ASSIGN_OR_RETURN(out.data_blobs, BundleDataBlobs(text));
  for (const auto& [key, id] : out.data_blobs) {
    ML_ASSIGN_OR_RETURN(std::string local, resolver(id, key));
    *DataField(spec.data, key) = local;
  }
  out.task = std::move(spec);
  return out;
}

uint64_t EstimateFlopsPerSample(const engine::TaskSpec& task, uint64_t num_params) {
  // The engine derives it, layer by layer (engine::LayerCosts; pipeline cuts use the same
  // numbers). A spec that does not plan has no layers to count: 6 x parameters.
  Result<uint64_t> flops = engine::TrainingFlopsPerSample(task.model, task.seq_len);
  return flops.ok() ? *flops : 6 * num_params;
}

TaskFacts ComputeTaskFacts(const engine::Trainer& trainer, const NetworkSpec& net) {
  Result<TaskFacts> f = ComputeTaskFacts(trainer.task(), trainer.data(), net);
  CHECK(f.ok()) << f.status().ToString();  // the trainer built the model from the same spec
  return std::move(*f);
}

Result<TaskFacts> ComputeTaskFacts(const engine::TaskSpec& task, const engine::TaskData& data,
                                   const NetworkSpec& net) {
  TaskFacts f;
  protocol::TaskSpecView view = MakeTaskView(task, data, net);
  ML_ASSIGN_OR_RETURN(const int64_t num_params, engine::CountParameters(task.model));
  f.num_params = static_cast<uint64_t>(num_params);
  f.model_bytes = 4 * f.num_params;
  f.flops_per_sample = EstimateFlopsPerSample(task, f.num_params);
  ML_ASSIGN_OR_RETURN(f.memory_bytes, UnitMemoryBytes(task));
  f.num_examples = view.num_examples;
  f.batch_size = view.batch_size;
  f.seed = view.seed;
  f.content_id = view.id;
  // Always declared: a verifying chain refuses an exact-mode task without one (ledger
  // ValidateTaskTerms), since the ledger rules its disputes only from batches proven against it
  // (a tile's examples or token pages, a whole step's examples). A model whose step witness
  // would not fit a transaction (StepWitnessBound) gets one too: its disputes play the tile
  // phase (its mismatches carry the bundle), and only a whole step the tile phase cannot narrow
  // (an opaque operator) is left without a RefereeStep that fits, to end undecided at the
  // referee's deadline rather than be ruled by the genesis key.
  f.data_root = TaskDataRoot(data);
  if (data.tokens) f.data_page_tokens = static_cast<uint32_t>(engine::kTokenPageTokens);
  // A cut that cannot be made leaves the lists empty rather than failing here: the facts of such
  // a bundle are still computed (a node logs and refuses the task by them, a trainer's caller
  // must not crash on a submitter's bad table), and AddPipelineTerms names the fault.
  if (Result<StageTerms> terms = StageTermsOf(task, net); terms.ok()) {
    f.stage_memory_bytes = std::move(terms->memory_bytes);
    f.stage_flops = std::move(terms->flops);
    f.stage_boundary_bytes = std::move(terms->boundary_bytes);
    f.eval_memory_bytes = terms->eval_memory_bytes;
  }
  return f;
}

ledger::TaskParams MakeTaskParams(const TaskFacts& facts, const NetworkSpec& net,
                                  const Hash256& initial_state) {
  // A pipeline task's units are its replicas' stages (docs/protocol.md, "Pipeline stage units");
  // the per-stage needs and what crosses its boundaries come from its cut, in the facts
  // (StageTermsOf, stage_unit.h; a node compares them: CheckBundleMatchesLedger).
  const uint32_t stages = std::max<uint32_t>(net.stages, 1);
  return ledger::TaskParams{.rounds = net.rounds,
                            .units_per_round = net.units_per_round * stages,
                            .inner_steps = net.inner_steps,
                            .batch_size = facts.batch_size,
                            .checkpoint_interval = net.checkpoint_interval,
                            .flops_per_sample = facts.flops_per_sample,
                            .model_bytes = facts.model_bytes,
                            .memory_bytes = facts.memory_bytes,
                            .num_examples = facts.num_examples,
                            .seed = facts.seed,
                            .initial_state = initial_state,
                            .verification_window_blocks = net.verification_window_blocks,
                            .data_root = facts.data_root,
                            .assurance = static_cast<uint8_t>(net.assurance.kind),
                            .target_escape_ppm = net.assurance.target_escape_ppm,
                            .stages = stages,
                            .stage_memory_bytes = facts.stage_memory_bytes,
                            .stage_flops = facts.stage_flops,
                            .stage_boundary_bytes = facts.stage_boundary_bytes,
                            .data_page_tokens = facts.data_page_tokens,
                            .eval_memory_bytes = facts.eval_memory_bytes};
}

}  // namespace meshlearn::node

// The task bundle: what a submitter publishes so that any node can rebuild a network task.
//
// A bundle is the task file's TOML text with every data file path replaced by "blob:<hex id>"
// (the blob id of that file, net/blob.h), stored itself as a blob; its blob id is the task's
// spec_hash on the ledger (SubmitTaskTx::spec_hash). A node fetches the bundle, then each data
// blob, writes them as files under its data dir, and builds the engine TaskSpec with those paths.
//
//   // Submitter (`meshlearn task submit`, devnet):
//   ML_ASSIGN_OR_RETURN(TaskBundle b, MakeBundle(env, "examples/fashion-mlp.toml", &store));
//   // b.id = the bundle blob (spec_hash); b.files[i].id = the data blobs; all stored + pinned
//   // in `store`: push b.id and every b.files[i].id (and the initial state) with PushBlob.
//
//   // Node:
//   ML_ASSIGN_OR_RETURN(LoadedBundle t, LoadBundle(bundle_text, [&](const net::BlobId& id,
//                                                  const std::string& key) -> Result<std::string> {
//     ... fetch `id`, write it to a file, return the file's path ...
//   }));
//   ML_ASSIGN_OR_RETURN(auto trainer, engine::Trainer::Create(env, t.task));
//
// Data keys per [data] format: idx: train_images train_labels test_images test_labels;
// npy: train_x train_y test_x test_y; text: path; tokens: train val; and, in any format,
// init_weights when the task names initial weights (engine/train.h): that file is a blob of the
// bundle like the data, so the bundle's id (the task's spec_hash) commits to the initial weights
// too, and every node, verifier and audit starts from the same file. Each must be written as
// `key = "path"` on its own line inside the [data] table (the rewrite is textual so the rest of
// the file, comments included, stays as the submitter wrote it; the result is re-parsed and
// checked, so an unusual layout is refused with an error, never silently kept).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/net/blob.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/node/network_task.h"

namespace meshlearn::node {

inline constexpr size_t kMaxBundleBytes = 1 << 20;  // a task file is small text
inline constexpr char kBlobPathPrefix[] = "blob:";
inline constexpr char kInitWeightsKey[] = "init_weights";  // [data] key of the initial weights

struct BundleDataFile {
  std::string key;   // "train_images"
  std::string path;  // the submitter's local file (a corpus: its listing)
  net::BlobId id;
  uint64_t size = 0;
};

struct TaskBundle {
  std::string text;  // the bundle (rewritten TOML)
  net::BlobId id;    // blob id of `text`: the task's spec_hash
  std::vector<BundleDataFile> files;
};

// The [data] keys that name files for a data format ("idx" -> the four above).
std::vector<std::string> DataFileKeys(std::string_view format);
// The [data] keys a bundle publishes as blobs: DataFileKeys(format), then init_weights when set.
std::vector<std::string> BundleFileKeys(const engine::DataSpec& data);

// Reads the task file, checks it (engine TaskSpec and [network]), stores every data file and the
// bundle text in `store` (pinned) and returns the bundle.
Result<TaskBundle> MakeBundle(Env* env, const std::string& task_path, net::BlobStore* store);

// Replaces the values of `replacements` (key -> new string value) inside the [data] table of
// `toml`. Errors if a key is not found there. Pure (tests use it directly).
Result<std::string> RewriteDataPaths(
    std::string_view toml, const std::vector<std::pair<std::string, std::string>>& replacements);

// A corpus task's [data] (root, files, data_root: engine/corpus.h) as a one-file text task whose
// path is `path`: the `files` line becomes `path = "<path>"`, the root and data_root lines go.
// MakeBundle ships a corpus so, as the blob of its text. Pure.
Result<std::string> RewriteCorpusAsFile(std::string_view toml, const std::string& path);

// Returns the local path of data blob `id` (named `key` in [data]), fetching it if needed.
using BundleResolver =
    std::function<Result<std::string>(const net::BlobId& id, const std::string& key)>;

struct LoadedBundle {
  engine::TaskSpec task;  // data paths = the resolver's local files
  NetworkSpec net;
  std::vector<std::pair<std::string, net::BlobId>> data_blobs;  // key -> id
};

// The data blobs a bundle needs, without resolving them.
Result<std::vector<std::pair<std::string, net::BlobId>>> BundleDataBlobs(std::string_view text);
// Parses and validates a bundle (refuses a data path that is not "blob:<64 hex>", anything over
// kMaxBundleBytes, a missing or bad [network] table) and resolves its data blobs.
Result<LoadedBundle> LoadBundle(std::string_view text, const BundleResolver& resolver);

// The facts of a task that come from its model and data (protocol::TaskFacts): from the task (its
// model complete, as LoadTaskData leaves it) and its data, without building the model (a stage
// node needs no more), or from a trainer's. Computing the data root hashes the training set
// once. Errors: the model spec's own.
Result<TaskFacts> ComputeTaskFacts(const engine::TaskSpec& task, const engine::TaskData& data,
                                   const NetworkSpec& net);
TaskFacts ComputeTaskFacts(const engine::Trainer& trainer, const NetworkSpec& net);

// The ledger's TaskParams of a task (what SubmitTaskTx carries), the one builder of them (the
// submitter's CLI, devnet and the bundle check of every node call it): from the [network] table
// and the facts; initial_state = blob id of EncodeGlobalState(InitialState(trainer)); data_root =
// facts.data_root (always declared: a verifying chain refuses an exact-mode task without one);
// checkpoint_interval = net.checkpoint_interval, whose default (inner_steps) NetworkSpec::
// FromConfig decided; memory_bytes = facts.memory_bytes (UnitMemoryBytes: what a whole unit
// needs); a pipeline's stage_memory_bytes, stage_flops and stage_boundary_bytes from the facts'
// (StageTermsOf of its cut). The tolerance thresholds are
// left 0: `task submit` profiles them.
ledger::TaskParams MakeTaskParams(const TaskFacts& facts, const NetworkSpec& net,
                                  const Hash256& initial_state);

// The model a global state of `num_weights` floats belongs to, from a task's [model]: the spec
// itself, or, for a GPT whose vocab_size comes from the data (0 in the file, hence in the
// bundle), the spec with the vocab_size that gives exactly `num_weights` parameters (a GPT's
// parameter count is affine in the vocabulary). Lets a model be written from a task's state
// without loading its data (`task fetch`). Errors if no vocabulary fits.
// (ledger/step_witness.h: the ledger resolves a stage witness's model the same way.)
using ledger::ModelSpecForState;

// Training FLOPs of one sample, forward + backward (3 x the forward multiply-adds x 2): linear
// and conv2d layers counted exactly from their shapes, GPT as 6 x parameters x seq_len plus
// attention. The standard benchmark (`node bench`) uses the same count, so the scheduler's time
// estimates are consistent.
uint64_t EstimateFlopsPerSample(const engine::TaskSpec& task, uint64_t num_params);

}  // namespace meshlearn::node

// Training tasks: a TOML file describing data, model, optimizer and schedule, and the Trainer that
// runs it step by step, deterministically.
//
//   [task]
//   name = "fashion-mlp"
//   seed = 1                     # init, data order, dropout
//   stream = 0                   # work-unit id: a different stream draws different batches
//   [data]
//   format = "idx"               # idx | npy | text | tokens
//   train_images = "...train-images-idx3-ubyte.gz"   (idx; npy uses train_x/train_y/test_x/test_y)
//   train_labels = "..."; test_images = "..."; test_labels = "..."
//   mean = 0.2860; std = 0.3530  # x = (pixel/255 - mean) / std
//   # text: path = "/usr/share/common-licenses/GPL-3", val_fraction = 0.1 (character level)
//   # text, many files (corpus.h): root = "/usr/lib/python3.11", files = "LISTING",
//   #   data_root = "<BLAKE2b-256 of LISTING>" instead of path
//   # tokens: train = "train.bin", val = "val.bin", vocab_size = 50304 (uint16 files)
//   init_weights = "init.safetensors"   # optional, any format: round 0's weights (below)
//   [model] ...                  # see model.h
//   [optimizer] ...              # see optim.h
//   [train]
//   steps = 2000
//   batch_size = 128
//   micro_batches = 1            # the step runs as this many micro-batches of batch_size /
//                                # micro_batches (must divide it); gradients accumulate in a fixed
//                                # order and the optimizer steps once (pipeline.h). 1 = one pass.
//   seq_len = 64                 # GPT only; default block_size
//   eval_batch_size = 1000       # classification evaluation chunk
//   eval_batches = 8             # GPT: batches of validation windows
//
// Relative data paths are resolved against the task file's directory.
//
// Initial weights. Without data.init_weights a model starts from Model::Init(task.seed). With
// it, the file (safetensors, e.g. what meshlearn.torch.export writes) is round 0's weights: it
// must hold exactly the model's parameters, each under its engine name ("layers.1.weight",
// "transformer.h.0.attn.c_attn.weight"), float32, of the model's shape, finite; nothing missing,
// nothing more (LoadInitWeights names the file, the tensor and the fix). LoadTaskData reads it;
// Trainer::Create is the one place initial weights are made, so `train`, `diloco`, nodes,
// verifiers and `task audit` all start from the same values. A network task publishes the file
// as a blob of its bundle (node/task_bundle.h), so the task's spec_hash commits to it, and its
// params.initial_state is the state these weights give.
//
//   ML_ASSIGN_OR_RETURN(TaskSpec task, TaskSpec::Load(env, "examples/fashion-mlp.toml"));
//   ML_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> tr, Trainer::Create(env, task));
//   while (tr->state().step < task.steps) tr->Step();
//   ML_ASSIGN_OR_RETURN(EvalResult r, tr->Evaluate());
//   Hash256 h = StateHash(tr->state());
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/data.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/safetensors.h"

namespace meshlearn::engine {

struct DataSpec {
  std::string format;                            // idx | npy | text | tokens
  std::string train_x, train_y, test_x, test_y;  // idx: images/labels; npy: x/y
  double mean = 0.0, std = 1.0;
  std::string text_path;  // text, one file
  // text, a corpus (corpus.h): the files of `text_files` (a listing) under `text_root`, whose
  // listing must hash to `data_root`.
  std::string text_root, text_files, data_root;
  double val_fraction = 0.1;
  std::string train_tokens, val_tokens;  // tokens
  int64_t vocab_size = 0;                // tokens
  std::string init_weights;  // any format: a safetensors file of round 0's weights ("": seed)
};

struct TaskSpec {
  std::string path;  // the task file (for messages)
  std::string name;
  uint64_t seed = 1;
  uint64_t stream = 0;
  DataSpec data;
  ModelSpec model;
  OptimizerSpec optimizer;
  int64_t steps = 0;
  int64_t batch_size = 0;
  int64_t micro_batches = 1;  // divides batch_size (checked by Parse)
  int64_t seq_len = 0;
  int64_t eval_batch_size = 1000;
  int64_t eval_batches = 8;

  static Result<TaskSpec> Load(Env* env, const std::string& path);
  static Result<TaskSpec> Parse(std::string_view toml, const std::string& name,
                                const std::string& base_dir);
};

// Loaded data of a task: classification (train/test) or tokens (train/val).
struct TaskData {
  bool tokens = false;
  ClassificationData train, test;
  TokenData train_tokens, val_tokens;
  CharVocab vocab{};  // text only
  Hash256 data_root;  // a text corpus: BLAKE2b-256 of its listing (checked); zero otherwise
  int64_t corpus_files = 0, corpus_bytes = 0;  // a text corpus: how many files, bytes
  // data.init_weights, read (not yet checked against the model: LoadInitWeights does that).
  std::shared_ptr<const SafetensorsFile> init_weights;
};
// Loads and validates the data; for GPT text tasks fills in model.gpt.vocab_size when it is 0
// (and checks it otherwise). Every error names the task file and the key of the file
// ("x.toml: data.train_images: cannot open /usr/share/...: No such file or directory; install
// dataset-fashion-mnist or fix the path"). Before reading anything it checks that every file
// exists, is a regular file (not a FIFO, device or directory) and is at most half of
// AvailableMemoryBytes().
Result<TaskData> LoadTaskData(Env* env, TaskSpec& task);
// The loading itself, without those checks and prefixes.
Result<TaskData> LoadTaskDataUnchecked(Env* env, TaskSpec& task);
// The text a text task trains on, before tokenizing: its one file (data.path), or its corpus's
// files concatenated in the listing's order (data.files, checked against data.data_root). The
// same text gives the same tokens in either form: a network task's bundle ships a corpus as one
// file of it (node/task_bundle.h). Errors name the task file and the key.
Result<std::string> LoadTaskText(Env* env, const TaskSpec& task);

// Sets `model`'s parameters from `file` (data.init_weights): every parameter must be there under
// its name, F32, of its shape, finite, and the file may hold nothing else. Errors are
// InvalidArgument "<where>: <file>: tensor 'NAME' ...; <fix>". Pure (no I/O).
Status LoadInitWeights(const SafetensorsFile& file, const std::string& where, Model* model);

// OK when training the task's model at its batch size fits in AvailableMemoryBytes()
// (EstimateMemory: weights, gradients, optimizer moments, activations); else ResourceExhausted
// naming the task file, the key to change (the largest layer, or train.batch_size) and the
// machine's memory. Trainer::Create calls it; so can anyone about to train (dry runs).
Status CheckTrainingMemory(const TaskSpec& task);

struct EvalResult {
  double loss = 0;       // mean cross-entropy
  double accuracy = -1;  // classification only (fraction of argmax == label); -1 otherwise
  int64_t samples = 0;   // examples (classification) or predicted tokens (GPT)
};

// Evaluates `model` on the task's test / validation split, deterministically.
EvalResult Evaluate(Model& model, const TaskSpec& task, const TaskData& data);
// How many validation windows Evaluate takes for a token task: consecutive, non-overlapping
// windows of seq_len tokens from the start of the validation split (window w starts at token
// w x seq_len), at most eval_batches x batch_size of them.
int64_t EvalWindowCount(const TaskSpec& task, const TaskData& data);
// Validation windows [first, first + count) of a token task, as Evaluate reads them.
Batch EvalWindows(const TaskSpec& task, const TaskData& data, int64_t first, int64_t count);

// Sets every parameter of `model` from `params`, concatenated in model order (the layout of
// weights and deltas on the wire). InvalidArgument when the size is not the model's.
Status SetFlatParams(Model& model, std::span<const float> params);

// The samples one optimizer step of the task trains on.
int64_t SamplesPerStep(const TaskSpec& task);

// The batches of one data stream of a task: step s's batch is a pure function of (task.seed,
// `stream`, s) and the data. Trainer::BatchForStep draws through one; a pipeline stage node draws
// its unit's batches with one without building the whole model. `data` must outlive it.
class DataStream {
 public:
  DataStream(const TaskSpec& task, const TaskData& data, uint64_t stream);
  Batch BatchForStep(int64_t step);
  // Hands a used batch back: the next classification batch fills its inputs' storage instead of
  // a new zero-filled tensor (MakeClassificationBatch).
  void Recycle(Batch batch) { spare_inputs_ = std::move(batch.inputs); }

 private:
  const TaskData* data_;
  uint64_t seed_, stream_;
  int64_t batch_size_, seq_len_;
  std::unique_ptr<BatchSampler> sampler_;  // classification data only
  Tensor spare_inputs_;                    // from Recycle, until the next batch takes it
};

class Trainer {
 public:
  // Loads the data, builds the model, initialises it (data.init_weights when the task names
  // them, else from task.seed), creates the optimizer.
  static Result<std::unique_ptr<Trainer>> Create(Env* env, TaskSpec task);
  // Same, with data already loaded by LoadTaskData(env, task) (tests and benchmarks reuse it).
  static Result<std::unique_ptr<Trainer>> Create(TaskSpec task, TaskData data);
  // Same, sharing data someone else also holds (a node's task context keeps it for the roles
  // that need only the data: the trainer, built later, reads the same copy).
  static Result<std::unique_ptr<Trainer>> Create(TaskSpec task,
                                                 std::shared_ptr<const TaskData> data);

  // Continues from a checkpoint of the same task (model and optimizer must match).
  Status Resume(TrainState state);

  // One optimizer step on the batch of step state().step; returns the batch loss.
  float Step();
  // The same step on `batch` instead (an adversary's forged batch; the task's dropout seed and
  // micro-batches as Step).
  float StepOn(const Batch& batch);
  EvalResult Evaluate() { return engine::Evaluate(*state_.model, task_, *data_); }

  TrainState& state() { return state_; }
  const TaskSpec& task() const { return task_; }
  const TaskData& data() const { return *data_; }
  float last_grad_norm() const { return last_grad_norm_; }
  int64_t samples_per_step() const;
  // The batch of a given step (a pure function of seed, stream, step).
  Batch BatchForStep(int64_t step);

  // ---- Work units (network training). A unit restarts the trainer on a new data stream from
  // given weights: parameters <- `params`, fresh (zeroed) optimizer state, step 0, stream
  // `stream`, a constant inner learning rate lr x `lr_scale` (the [optimizer] schedule and
  // warm-up are for `train`; a unit ignores them). So a unit's result depends
  // only on (task, params, stream, lr_scale), whoever runs it. Errors if params has the wrong size.
  Status StartUnit(uint64_t stream, std::span<const float> params, double lr_scale = 1.0);
  // All parameters, concatenated in model order (the layout of weights and deltas on the wire).
  std::vector<float> FlatParams() const;
  // REQUIRES-checked: params.size() == number of parameters.
  Status SetFlatParams(std::span<const float> params);

 private:
  Trainer(TaskSpec task, std::shared_ptr<const TaskData> data)
      : task_(std::move(task)), data_(std::move(data)) {}

  TaskSpec task_;
  std::shared_ptr<const TaskData> data_;  // never null
  TrainState state_;
  std::unique_ptr<DataStream> stream_;  // task_.stream's batches
  float last_grad_norm_ = 0;
};

// The whole model of a task to evaluate states with, and nothing training needs: its parameters'
// values (Model::CreateForEvaluation: no gradients) and no optimizer. A Trainer holds both, three
// times the weights with AdamW; a pipeline task's aggregator, which trains nothing (its stages'
// nodes do), evaluates each round's new state with one of these.
//
//   ML_ASSIGN_OR_RETURN(std::unique_ptr<Evaluator> ev, Evaluator::Create(task, data));
//   ML_RETURN_IF_ERROR(ev->SetFlatParams(state.weights));
//   EvalResult r = ev->Evaluate();  // bit for bit a Trainer's Evaluate at the same weights
// What an Evaluator of `task` holds, from the spec alone (nothing is allocated): its weights
// (`parameters`; no gradients, no optimizer moments: both 0) and what one forward of Evaluate
// keeps (`activations`: EstimateMemory's at Evaluate's batch, a GPT's batch_size windows of
// seq_len tokens, a classifier's eval_batch_size samples). A pipeline task's aggregator is placed
// by its total (TaskParams::eval_memory_bytes, protocol::AggregatorMemoryBytes).
Result<MemoryEstimate> EstimateEvaluationMemory(const TaskSpec& task);

class Evaluator {
 public:
  static Result<std::unique_ptr<Evaluator>> Create(TaskSpec task,
                                                   std::shared_ptr<const TaskData> data);
  Status SetFlatParams(std::span<const float> params) {
    return engine::SetFlatParams(*model_, params);
  }
  EvalResult Evaluate() { return engine::Evaluate(*model_, task_, *data_); }
  const Model& model() const { return *model_; }
  const TaskSpec& task() const { return task_; }

 private:
  Evaluator(TaskSpec task, std::shared_ptr<const TaskData> data)
      : task_(std::move(task)), data_(std::move(data)) {}

  TaskSpec task_;
  std::shared_ptr<const TaskData> data_;  // never null
  std::unique_ptr<Model> model_;
};

}  // namespace meshlearn::engine

// The command line of the Fashion-MNIST example. It is parsed in its own translation unit
// (options.cpp), so the training code compiles without the command-line parser's headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

/// What the command line sets.
struct config {
  std::optional<std::size_t> replicas;  ///< default: 2 on cpu, every visible GPU on gpu
  std::string device = "cpu";           ///< cpu or gpu
  std::optional<std::uint64_t> epochs;  ///< epochs to train (default: see epochs_of)
  std::size_t batch = 128;              ///< the global batch
  float lr = 1e-3f;                     ///< peak learning rate of AdamW
  float weight_decay = 0.02f;           ///< AdamW's decoupled weight decay
  std::uint64_t seed = 42;              ///< seed of initialisation, dropout and shuffling
  std::string model = "mlp";            ///< mlp, small, cnn or cnn_bn
  std::string data = "/usr/share/datasets/fashion-mnist";  ///< directory of the data set (see data_format)
  std::string data_format = "idx";      ///< idx (*-ubyte.gz), png-folder or tar-shards (made by export_images)
  std::string checkpoint_dir;           ///< where checkpoints go ("" = none)
  std::string metrics_file;             ///< JSON-lines metrics ("" = none)
  std::string tensorboard;              ///< directory of TensorBoard event files ("" = none)
  std::string export_file;              ///< safetensors file of the trained weights ("" = none)
  std::string export_dtype = "f32";     ///< f32, bf16 or f16
  std::string trace_file;               ///< timeline of the steps in trace_steps, Chrome trace-event format ("" = none)
  std::string trace_steps = "10:20";    ///< the steps --trace records, A:B (A to B - 1) or A: (to the end)
  std::size_t accumulate = 1;           ///< global batches per update; the pipeline's batch is batch / accumulate
  std::string precision = "fp32";      ///< the model's precision policy: fp32, bf16, fp16 or tf32 (gpu)
  double clip_norm = 0;                 ///< > 0: clip each update's gradient to this global norm
  float clip_value = 0;                 ///< > 0: clamp each gradient element to [-clip_value, clip_value]
  double ema = 0;                       ///< decay of an EMA of the weights, evaluated and exported (0: none)
  float label_smoothing = 0;            ///< label smoothing of the cross-entropy, in [0, 1)
  bool invariant = false;               ///< determinism::replica_count_invariant (cpu): the same bits for any replica count
  bool resume = false;                  ///< continue from the newest checkpoint
  bool shard_optimizer = false;         ///< always split the optimiser update and its state over the replicas
  bool no_shard_optimizer = false;      ///< never split it (default: lockstep decides)
  bool quiet = false;                   ///< no progress output
  std::size_t workers = 0;              ///< expected worker processes (0: as launched)
};

/// The epochs to train: --epochs, else 20 for the MLPs and 12 for the CNNs.
inline std::uint64_t epochs_of(const config& c) {
  return c.epochs.value_or(c.model == "cnn" || c.model == "cnn_bn" ? 12 : 20);
}

/// Parses the command line into `c`. Returns -1 to go on, or the exit code to end with: 0 after
/// printing the help, 2 after printing a bad option's one-line message and `run with --help for
/// usage`.
int parse_command_line(int argc, char** argv, config& c);

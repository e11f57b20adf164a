// Trains an MLP or a CNN on Fashion-MNIST with synchronous data parallelism over several replicas
// fed by one input pipeline, then prints the exact test accuracy as the last line of stdout.
//
//   fashion_mnist [--replicas N] [--device cpu|gpu] [--epochs E] [--batch B] [--lr LR] [--seed S]
//                 [--model mlp|small|cnn|cnn_bn] [--checkpoint-dir DIR] [--resume] [--data DIR]
//                 [--metrics-file FILE] [--tensorboard DIR] [--export FILE [--export-dtype f32|bf16|f16]]
//                 [--trace FILE [--trace-steps A:B]] [--accumulate K] [--clip-norm C] [--clip-value V]
//                 [--ema DECAY] [--label-smoothing E] [--replica-count-invariant] [--precision fp32|bf16|fp16|tf32]
//                 [--data-format idx|png-folder|tar-shards] [--quiet] [--workers W]
//
// The replica count is a run-time value: each model is instantiated once per device kind
// (mirrored<cpus> / mirrored<gpus>), whatever N is.
//
// Built with MPI (lockstep::mpi) and launched by mpirun (`mpirun -np 2 fashion_mnist --replicas 1`),
// every process is a worker of multi_worker_mirrored<cpus> with N local replicas (default 1); the
// global batch is split over all replicas of all workers, and only rank 0 prints progress and the
// result line and writes metrics and checkpoints.

// Output uses <cstdio> rather than {fmt}: {fmt}'s compile-time format checks do not build under nvcc,
// and this file is also compiled as CUDA when LOCKSTEP_HAS_CUDA is set. The command line is parsed
// in options.cpp.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include <lockstep/data.hpp>
#include <lockstep/distribute/mpi_launch.hpp>
#include <lockstep/lockstep.hpp>
#ifdef LOCKSTEP_HAS_CUDA
#include <lockstep/cuda.hpp>
#endif
#ifdef LOCKSTEP_HAS_MPI
#include <lockstep/distribute/multi_worker.hpp>
#endif
#ifdef LOCKSTEP_HAS_IMAGES
#include <lockstep/data/images.hpp>
#endif

#include "options.hpp"

namespace ls = lockstep;

namespace {

/// 784-512-256-10 with ReLU and dropout: the default model.
using mlp = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dropout<1, 5>, ls::dense<512, 256>, ls::relu,
                           ls::dropout<1, 5>, ls::dense<256, 10>>;
/// 784-256-10: a quicker, smaller model.
using small = ls::sequential<ls::dense<784, 256>, ls::relu, ls::dropout<1, 10>, ls::dense<256, 10>>;
/// The CNN of TensorFlow's layers tutorial: conv 5x5 (32) → max pool 2 → conv 5x5 (64) → max pool 2 →
/// dense 1024 → dropout 0.4 → dense 10, ReLU after the convolutions and the first dense layer.
using cnn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                           ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten, ls::dense<3136, 1024>,
                           ls::relu, ls::dropout<2, 5>, ls::dense<1024, 10>>;
/// The same with batch normalisation (statistics over the global batch) after each convolution.
using cnn_bn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::batch_norm<>, ls::relu,
                              ls::max_pool2d<2>, ls::conv2d<64, 5, 1, 2>, ls::batch_norm<>, ls::relu, ls::max_pool2d<2>,
                              ls::flatten, ls::dense<3136, 1024>, ls::relu, ls::dropout<2, 5>, ls::dense<1024, 10>>;

/// A combination of options this build or device cannot run: `error: <message>`, exit code 2.
struct usage_error : ls::config_error {
  using ls::config_error::config_error;
};

/// The images and labels of `split` (train, t10k) in --data's IDX files, decoded once.
std::shared_ptr<const ls::data::table> images(const config& c, const char* split) {
  const auto dir = std::filesystem::path(c.data);
  return ls::data::idx_table((dir / (std::string(split) + "-images-idx3-ubyte.gz")).string(),
                             (dir / (std::string(split) + "-labels-idx1-ubyte.gz")).string());
}

/// --shard-optimizer, --no-shard-optimizer, or neither: lockstep decides.
ls::optimizer_sharding sharding_of(const config& c) {
  if (c.shard_optimizer) return true;
  if (c.no_shard_optimizer) return false;
  return ls::optimizer_sharding::automatic();
}

/// The pipeline's batch: --batch, cut into --accumulate batches per update.
std::size_t pipeline_batch(const config& c) {
  if (c.batch % c.accumulate != 0)
    throw usage_error("--accumulate " + std::to_string(c.accumulate) + ": --batch " + std::to_string(c.batch) +
                      " is not a multiple of it (each update's batch is cut into --accumulate equal batches)");
  return c.batch / c.accumulate;
}

/// Calls f(train_set, test_set, training samples) with the pipelines of --data-format: the IDX
/// files decoded once, or (index first) a PNG folder or tar shards written by export_images,
/// whose batches are decoded when cut into this process's shards. All three yield the same
/// batches, bit for bit. The pipeline's report is printed by the `chief` only.
template <class F>
int with_data(const config& c, [[maybe_unused]] bool chief, F&& f) {
  namespace ld = ls::data;
  if (c.data_format == "idx") {
    // the training set first, so that a missing directory is reported by its training file
    const auto train_table = images(c, "train");
    const std::size_t rows = train_table->rows;
    auto train = ld::from_table(train_table) | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(rows, c.seed) |
                 ld::batched(pipeline_batch(c)) | ld::prefetch(2);
    auto test = ld::from_table(images(c, "t10k")) | ld::map(ld::scale(1.0f / 255)) | ld::batched(1000);
    return f(train, test, rows);
  }
#ifdef LOCKSTEP_HAS_IMAGES
  const auto dir = std::filesystem::path(c.data);
  const auto source = [&](const std::string& split) {
    if (c.data_format == "png-folder") {
      ld::image_folder_options o;
      o.image.channels = 1;  // grey, as the IDX rows
      o.list_file = (dir / (split + ".txt")).string();
      return ld::image_folder((dir / split).string(), o);
    }
    std::vector<std::string> shards;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().starts_with(split + "-") && e.path().extension() == ".tar")
        shards.push_back(e.path().string());
    if (shards.empty()) throw usage_error{"--data " + c.data + ": no " + split + "-*.tar shards (write them with export_images)"};
    ld::tar_shards_options o;
    o.image.channels = 1;
    return ld::tar_shards(shards, o);
  };
  const auto train = source("train");
  const std::size_t rows = train.size();
  auto train_set = train | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(rows, c.seed) | ld::batched(pipeline_batch(c)) |
                   ld::prefetch(2);
  auto test_set = source("t10k") | ld::map(ld::scale(1.0f / 255)) | ld::batched(1000);
  const int rc = f(train_set, test_set, rows);
  if (!c.quiet && chief) std::fprintf(stderr, "%s", train.report().text().c_str());
  return rc;
#else
  throw usage_error{"--data-format " + c.data_format + ": this build has no image component (install libpng-dev and "
                    "libjpeg62-turbo-dev and reconfigure)"};
#endif
}

/// The model of Net on `strategy` under the precision policy of --precision (the policy's model
/// stores fp32 weights, so every policy gives the same model type).
template <class Net, class Kind, class Strategy>
typename Strategy::template model_type<Net> replicate_model(Strategy& strategy, const config& c) {
  const ls::seed seed{c.seed};
  if (c.precision == "bf16") return strategy.template replicate<Net, ls::mixed<ls::bf16>>(seed);
  if (c.precision == "fp16") return strategy.template replicate<Net, ls::mixed<ls::fp16>>(seed);
  if (c.precision == "tf32") {
    if constexpr (!std::is_same_v<Kind, ls::cpus>)
      return strategy.template replicate<Net, ls::tf32>(seed);
    else
      throw usage_error(
          "--precision tf32: gpu replicas only (TF32 tensor cores); cpu replicas take fp32, bf16 or fp16 (emulated)");
  }
  return strategy.template replicate<Net>(seed);
}

/// Trains on `strategy` (mirrored or multi-worker) with the given pipelines, whose training set
/// holds `train_rows` samples; `workers` processes take part, and this one prints when `chief`.
template <class Net, class Kind, class Strategy, class Train, class Test>
int train_with(Strategy& strategy, const config& c, std::size_t workers, bool chief, const Train& train_set,
               const Test& test_set, std::size_t train_rows) {
  const std::size_t n = strategy.num_replicas();
  const bool quiet = c.quiet || !chief;
  // Each process sees the cores it may run on (mpirun binds a worker to its own cores).
  if (ls::backend_traits<Kind>::replica_owns_core && n > static_cast<std::size_t>(ls::allowed_cpu_count()) && !quiet)
    std::fprintf(stderr, "warning: %zu cpu replicas on %d allowed cores: the replicas share cores (oversubscribed)\n",
                 n, ls::allowed_cpu_count());
  auto model = replicate_model<Net, Kind>(strategy, c);

  // Updates per epoch: the pipeline's batches, --accumulate to an update (the last one shorter).
  const std::uint64_t batches_per_epoch = (train_rows + pipeline_batch(c) - 1) / pipeline_batch(c);
  const std::uint64_t steps_per_epoch = (batches_per_epoch + c.accumulate - 1) / c.accumulate;
  const std::uint64_t epochs = epochs_of(c);
  ls::fit_options o;
  o.epochs = epochs;
  o.validation = test_set;
  o.callbacks.push_back(ls::lr_schedule(ls::cosine_schedule{.total = epochs * steps_per_epoch, .min_lr = 0.0f}));
  if (!c.tensorboard.empty()) o.callbacks.push_back(ls::tensorboard(c.tensorboard, {.chief = chief}));  // after the schedule
  o.quiet = c.quiet;
  o.show_kernels = true;  // the host GEMM's kernels, first line of the progress display (cpu replicas)
  o.metrics_file = c.metrics_file;
  o.checkpoint_dir = c.checkpoint_dir;
  o.resume = c.resume;
  o.data_seed = c.seed;
  o.steps_per_epoch = steps_per_epoch;
  o.accumulate = c.accumulate;
  o.clip_global_norm = c.clip_norm;
  o.clip_value = c.clip_value;
  o.ema.decay = c.ema;
  o.validate_with_ema = c.ema > 0;
  o.trace_file = c.trace_file;
  o.trace_steps = ls::parse_trace_steps(c.trace_steps);
  if (!quiet)
    std::fprintf(stderr,
                 "training %s on %zu worker(s) x %zu %s replica(s): %llu epochs, global batch %zu, AdamW lr %g (cosine), "
                 "seed %llu\n",
                 c.model.c_str(), workers, n, c.device.c_str(), static_cast<unsigned long long>(epochs), c.batch,
                 static_cast<double>(c.lr), static_cast<unsigned long long>(c.seed));
  const ls::softmax_cross_entropy loss{.label_smoothing = c.label_smoothing};
  (void)ls::fit(strategy, model, ls::adamw{.lr = c.lr, .weight_decay = c.weight_decay}, loss, train_set, o);
  // The test, and --export, use the EMA of the weights when there is one.
  const auto test = ls::evaluate(strategy, model, loss, test_set, c.ema > 0 ? ls::weights::ema : ls::weights::live);
  if (!quiet)
    std::fprintf(stderr, "test: loss %.4f, accuracy %.4f, top-5 %.4f over %llu samples\n", test.loss, test.accuracy,
                 test.top_k_accuracy, static_cast<unsigned long long>(test.samples));
  if (!c.export_file.empty() && chief) {
    const auto dtype = c.export_dtype == "bf16"  ? ls::io::safetensors_dtype::bf16
                       : c.export_dtype == "f16" ? ls::io::safetensors_dtype::f16
                                                 : ls::io::safetensors_dtype::f32;
    ls::save_safetensors(model, c.export_file, {.dtype = dtype, .ema = c.ema > 0});
    if (!quiet) std::fprintf(stderr, "weights written to %s (safetensors, %s)\n", c.export_file.c_str(), c.export_dtype.c_str());
  }
  if (chief) {
    std::printf("test_accuracy=%.4f\n", test.accuracy);
    std::fflush(stdout);
  }
  return 0;
}

/// Trains on `strategy` (mirrored or multi-worker) with the data of --data-format; `workers`
/// processes take part, and this one prints when `chief`.
template <class Net, class Kind, class Strategy>
int train_on(Strategy& strategy, const config& c, std::size_t workers, bool chief) {
  return with_data(c, chief, [&](const auto& train_set, const auto& test_set, std::size_t train_rows) {
    return train_with<Net, Kind>(strategy, c, workers, chief, train_set, test_set, train_rows);
  });
}

template <class Net, class Kind>
int train(const config& c) {
  // Default: 2 cpu replicas (the main job's), every visible GPU.
  const auto devices = c.replicas                          ? ls::device_selection::first(*c.replicas)
                       : std::is_same_v<Kind, ls::cpus> ? ls::device_selection::first(2)
                                                        : ls::device_selection::all();
  ls::strategy_options options{.shard_optimizer = sharding_of(c)};
  // GPU replicas: a step never waits for its own work (the progress line shows each update's
  // loss one step later); mixed<fp16>'s dynamic loss scale decides on the host, so not there.
  if constexpr (!std::is_same_v<Kind, ls::cpus>) options.defer_readback = c.precision != "fp16";
  if (c.invariant) {
    if constexpr (std::is_same_v<Kind, ls::cpus>) {
      ls::basic_mirrored<ls::select_reducer_t<ls::cpus>, ls::determinism::replica_count_invariant, ls::cpus> strategy(
          devices, options);
      return train_on<Net, Kind>(strategy, c, 1, true);
    } else {
      throw usage_error("--replica-count-invariant: cpu replicas only in this example");
    }
  }
  ls::mirrored<Kind> strategy(devices, options);
  return train_on<Net, Kind>(strategy, c, 1, true);
}

template <class Net>
int run(const config& c) {
#ifdef LOCKSTEP_HAS_MPI
  if (ls::launched_by_mpi()) {
    if (c.device != "cpu") throw usage_error("under mpirun only --device cpu is supported by this build");
    if (c.invariant) throw usage_error("--replica-count-invariant: not under mpirun in this example");
    ls::multi_worker_mirrored<ls::cpus> strategy(ls::device_selection::first(c.replicas.value_or(1)),
                                                 ls::strategy_options{.shard_optimizer = sharding_of(c)});
    if (c.workers) ls::require_world_size(c.workers);
    if (strategy.world().is_chief() && !c.quiet)
      std::fprintf(stderr, "MPI: %zu workers, thread level %s\n", strategy.world().size(),
                   ls::mpi_thread_level_name(strategy.world().thread_level()));
    return train_on<Net, ls::cpus>(strategy, c, strategy.world().size(), strategy.world().is_chief());
  }
#endif
  if (c.workers > 1) {
#ifdef LOCKSTEP_HAS_MPI
    ls::require_mpi_launch(c.workers, "fashion_mnist");
#else
    throw usage_error("--workers " + std::to_string(c.workers) +
                      ": this build has no MPI support (install libopenmpi-dev and reconfigure with -DLOCKSTEP_MPI=ON)");
#endif
  }
#ifndef LOCKSTEP_HAS_MPI
  if (ls::launched_by_mpi())  // each process would train alone and write the same files
    throw usage_error("started by an MPI launcher, but this build has no MPI support: every process would train on "
                      "its own (install libopenmpi-dev and reconfigure with -DLOCKSTEP_MPI=ON, or run it without mpirun)");
#endif
  if (c.device == "cpu") return train<Net, ls::cpus>(c);
#ifdef LOCKSTEP_HAS_CUDA
  return train<Net, ls::gpus>(c);
#else
  throw usage_error("--device gpu: this build has no CUDA support (configure with -DLOCKSTEP_CUDA=ON and nvcc)");
#endif
}

/// The model the command line names.
int run_model(const config& c) {
  (void)pipeline_batch(c);  // --accumulate that does not divide --batch: refused before any work
  if (!c.export_file.empty()) {  // written after training: its directory is checked before
    const std::filesystem::path dir = ls::io::directory_of(c.export_file);
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw usage_error("--export " + c.export_file + ": the directory " + dir.string() + " does not exist");
  }
  if (c.model == "small") return run<small>(c);
  if (c.model == "cnn") return run<cnn>(c);
  if (c.model == "cnn_bn") return run<cnn_bn>(c);
  return run<mlp>(c);
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  if (const int rc = parse_command_line(argc, argv, c); rc >= 0) return rc;
  // An error ends the program with `error: <what>` (and each nested cause) on stderr: exit code 2
  // for bad input, options or checkpoints (a lockstep::error), 1 for anything else.
#ifdef LOCKSTEP_HAS_MPI
  std::optional<ls::mpi_environment> mpi;
  if (ls::launched_by_mpi()) mpi.emplace(argc, argv);
  ls::run_main_options report;
  if (mpi) report.prefix = "rank " + std::to_string(mpi->rank()) + ": ";
  const int code = ls::run_main([&] { return run_model(c); }, report);
  // Under MPI, a failure on one rank ends the whole job (the others may wait in a collective).
  if (mpi && code != 0) mpi->abort_on_exit(code);
  return code;
#else
  return ls::run_main([&] { return run_model(c); });
#endif
}

// The command line of the Fashion-MNIST example, parsed with CLI11 (see options.hpp).
#include "options.hpp"

#include <CLI/CLI.hpp>

#include <lockstep/core/trace.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <system_error>

namespace {

// Validators with messages that name the value and what was expected. CLI11 runs them on the
// text before converting it, and puts the option's name in front of their message.

/// The text of a value for a message: quoted, and cut to 32 characters.
std::string shown_value(const std::string& v) {
  return "'" + (v.size() > 32 ? v.substr(0, 32) + "...' (" + std::to_string(v.size()) + " characters)" : v + "'");
}

/// An integer from lo to hi.
CLI::Validator integer_in(std::uint64_t lo, std::uint64_t hi) {
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& v) -> std::string {
        std::uint64_t n = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (v.empty() || end != v.data() + v.size() || (ec != std::errc{} && ec != std::errc::result_out_of_range))
          return shown_value(v) + " is not a number (" + range + ")";
        if (ec == std::errc::result_out_of_range || n < lo || n > hi) return "must be " + range + ", got " + shown_value(v);
        return "";
      },
      range);
}

/// A finite number, > 0 when `positive`, else >= 0.
CLI::Validator finite_number(bool positive) {
  const std::string bound = positive ? "> 0" : ">= 0";
  return CLI::Validator(
      [positive, bound](std::string& v) -> std::string {
        double x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (v.empty() || end != v.data() + v.size() || (ec != std::errc{} && ec != std::errc::result_out_of_range))
          return shown_value(v) + " is not a number (a number " + bound + ")";
        if (ec == std::errc::result_out_of_range || !std::isfinite(x) ||
            std::fabs(x) > static_cast<double>(std::numeric_limits<float>::max()))
          return "must be a finite number " + bound + " (at most 3.4e38), got " + shown_value(v);
        if (positive ? !(x > 0) : !(x >= 0)) return "must be " + bound + ", got " + v;
        if (positive && !(static_cast<float>(x) > 0))  // the options are kept as floats
          return "must be " + bound + " as a float (at least 1.4e-45), got " + shown_value(v);
        return "";
      },
      std::string("a number ") + bound);
}

/// A number below 1 and above 0 (or from 0, when `zero`).
CLI::Validator fraction(bool zero) {
  const std::string range = zero ? "a number from 0 up to, not including, 1" : "a number between 0 and 1 (exclusive)";
  return CLI::Validator(
      [zero, range](std::string& v) -> std::string {
        double x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (v.empty() || end != v.data() + v.size() || ec != std::errc{} || !(zero ? x >= 0 : x > 0) || !(x < 1))
          return "must be " + range + ", got " + shown_value(v);
        if (!(static_cast<float>(x) < 1) || (!zero && !(static_cast<float>(x) > 0)))  // the options are kept as floats
          return "must be " + range + " as a float, got " + shown_value(v) + ", which rounds to " +
                 std::to_string(static_cast<float>(x));
        return "";
      },
      range);
}

/// `what`, on one line and at most 200 characters.
std::string one_line(std::string what) {
  for (char& ch : what)
    if (ch == '\n' || ch == '\r') ch = ' ';
  if (what.size() > 200) what = what.substr(0, 197) + "...";
  return what;
}

void describe(CLI::App& app, config& c) {
  app.add_option("--replicas", c.replicas,
                 "number of replicas: cpu, any N >= 1 (default 2, 1 per worker under mpirun; beyond the allowed "
                 "cores they share cores); gpu, up to the visible GPUs (default: all of them)")
      ->check(integer_in(1, 4096));
  app.add_option("--device", c.device, "device kind of the replicas")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--epochs", c.epochs, "epochs to train (default 20 for mlp and small, 12 for cnn and cnn_bn)")
      ->check(integer_in(1, 100000));
  app.add_option("--batch", c.batch, "global batch size (split across the replicas)")->check(integer_in(1, 60000));
  app.add_option("--lr", c.lr, "peak learning rate of AdamW (cosine decay to 0)")->check(finite_number(true));
  app.add_option("--weight-decay", c.weight_decay, "AdamW decoupled weight decay")->check(finite_number(false));
  app.add_option("--seed", c.seed, "seed of initialisation, dropout and shuffling")
      ->check(integer_in(0, std::numeric_limits<std::uint64_t>::max()));
  app.add_option("--model", c.model,
                 "model preset: mlp (784-512-256-10, dropout 0.2), small (784-256-10), cnn (TensorFlow's layers-tutorial "
                 "CNN: conv5x5(32), maxpool2, conv5x5(64), maxpool2, dense 1024, dropout 0.4, dense 10) or cnn_bn "
                 "(cnn with batch normalisation after each convolution)")
      ->check(CLI::IsMember({"mlp", "small", "cnn", "cnn_bn"}));
  app.add_option("--data", c.data,
                 "directory of the data set: the *-ubyte.gz files (idx), or what export_images wrote (png-folder: "
                 "train/, train.txt, t10k/, t10k.txt; tar-shards: train-*.tar, t10k-*.tar)");
  app.add_option("--data-format", c.data_format,
                 "idx (decoded once), png-folder or tar-shards (index first: each process decodes only its rows)")
      ->check(CLI::IsMember({"idx", "png-folder", "tar-shards"}));
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "write a checkpoint after every epoch into this directory");
  app.add_option("--metrics-file", c.metrics_file, "append one JSON object per epoch to this file");
  app.add_option("--tensorboard", c.tensorboard,
                 "write TensorBoard scalars (loss, accuracy, learning rate, samples/s per epoch; loss and learning "
                 "rate per step) into this directory");
  auto* export_file = app.add_option("--export", c.export_file,
                                     "save the trained weights to this safetensors file, with the names and layouts "
                                     "of PyTorch's nn.Sequential");
  app.add_option("--export-dtype", c.export_dtype, "element type of --export")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->needs(export_file);
  app.add_option("--accumulate", c.accumulate,
                 "batches per update (gradient accumulation): the pipeline's batch is --batch / k, so the update "
                 "batch, the schedule and the number of updates are those of --batch alone")
      ->check(integer_in(1, 60000));
  app.add_option("--precision", c.precision,
                 "the model's precision policy: fp32, bf16 (mixed<bf16>: bf16 GEMM inputs, fp32 accumulation and "
                 "weights), fp16 (mixed<fp16>: the same in fp16 with a dynamic loss scale; emulated on cpu replicas) "
                 "or tf32 (TF32 tensor-core GEMMs; gpu replicas)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "tf32"}));
  app.add_option("--clip-norm", c.clip_norm, "clip each update's gradient to this global norm")->check(finite_number(true));
  app.add_option("--clip-value", c.clip_value, "clamp each gradient element to [-v, v]")->check(finite_number(true));
  app.add_option("--ema", c.ema,
                 "keep an exponential moving average of the weights with this decay (0 < d < 1); it is what "
                 "validation, the test and --export use")
      ->check(fraction(false));
  app.add_option("--label-smoothing", c.label_smoothing, "label smoothing of the cross-entropy, in [0, 1)")
      ->check(fraction(true));
  app.add_flag("--replica-count-invariant", c.invariant,
               "determinism::replica_count_invariant (cpu): the same bits for any number of replicas and any "
               "--accumulate");
  app.add_option("--trace", c.trace_file,
                 "write a timeline of the steps of --trace-steps to this file (Chrome trace-event format: open it in "
                 "ui.perfetto.dev or chrome://tracing)");
  app.add_option("--trace-steps", c.trace_steps, "the steps --trace records: A:B (A to B - 1) or A: (to the end)")
      ->needs("--trace")
      ->check([](const std::string& v) -> std::string {
        try {
          (void)lockstep::parse_trace_steps(v);
        } catch (const lockstep::config_error&) {
          return "must be A:B (the steps A to B - 1, B > A) or A: (every step from A), got '" + v + "'";
        }
        return {};
      });
  app.add_flag("--resume", c.resume, "continue from the newest checkpoint in --checkpoint-dir")
      ->needs("--checkpoint-dir");
  auto* shard = app.add_flag("--shard-optimizer", c.shard_optimizer,
                             "each replica updates 1/N of the parameters and keeps 1/N of the AdamW state (default: "
                             "lockstep decides; on cpu replicas it shards AdamW's update)");
  app.add_flag("--no-shard-optimizer", c.no_shard_optimizer, "every replica updates every parameter")->excludes(shard);
  app.add_flag("-q,--quiet", c.quiet, "no progress output (the result line is still printed)");
  app.add_option("--workers", c.workers,
                 "expected number of worker processes (launch them with mpirun -np W; default: as launched)")
      ->check(integer_in(1, 4096));
}

constexpr const char* summary =
    "Trains an MLP or a CNN on Fashion-MNIST with lockstep's mirrored strategy; the last stdout line is test_accuracy=...";

}  // namespace

int parse_command_line(int argc, char** argv, config& c) {
  CLI::App app{summary};
  describe(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line that names the option and the value, and where the usage is: not the usage itself.
    std::fprintf(stderr, "error: %s\nrun with --help for usage\n", one_line(e.what()).c_str());
    return 2;
  }
  return -1;
}

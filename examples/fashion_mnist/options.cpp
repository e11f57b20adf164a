// The command line of the Fashion-MNIST example, parsed with CLI11 (see options.hpp).
#include "options.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>

namespace {

void describe(CLI::App& app, config& c) {
  app.add_option("--replicas", c.replicas,
                 "number of replicas: cpu, any N >= 1 (default 2; beyond the allowed cores they share cores); "
                 "gpu, up to the visible GPUs (default: all of them)");
  app.add_option("--device", c.device, "device kind of the replicas")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--epochs", c.epochs, "epochs to train (default 20 for mlp and small, 12 for cnn and cnn_bn)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--batch", c.batch, "global batch size (split across the replicas)")->check(CLI::Range(1, 60000));
  app.add_option("--lr", c.lr, "peak learning rate of AdamW (cosine decay to 0)")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", c.weight_decay, "AdamW decoupled weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", c.seed, "seed of initialisation, dropout and shuffling");
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
  app.add_flag("--resume", c.resume, "continue from the newest checkpoint in --checkpoint-dir");
  app.add_flag("--shard-optimizer", c.shard_optimizer,
               "each replica updates 1/N of the parameters and keeps 1/N of the AdamW state (cpu, one process)");
  app.add_flag("-q,--quiet", c.quiet, "no progress output (the result line is still printed)");
  app.add_option("--workers", c.workers,
                 "expected number of worker processes (launch them with mpirun -np W; default: as launched)")
      ->check(CLI::Range(1, 4096));
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
    std::fprintf(stderr, "error: %s\n%s", e.what(), app.help().c_str());
    return 2;
  }
  return -1;
}

std::string usage_text() {
  config unused;
  CLI::App app{summary};
  describe(app, unused);
  return app.help();
}

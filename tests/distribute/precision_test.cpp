// mixed<bf16> through a strategy: the policy is chosen by type at replicate, the model's type and
// its fp32 masters do not change, every replica holds the same bits, replica_count_invariant gives
// the same bits for 1, 2 and 3 replicas (per kernel set), the workers' collective plan names the
// policy, training follows fp32's within bf16's precision, fit names the policy and warns when it
// is emulated, and a checkpoint records the policy and resumes under another.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#include <lockstep/train/checkpoint.hpp>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;

struct precision_run {
  std::vector<float> params;
  std::vector<double> losses;
  bool identical = true;
  ls::compute_precision precision = ls::compute_precision::fp32;
  ls::collective_plan plan;
};

/// Six AdamW updates of mlp_dropout under policy P on `replicas` replicas (batches of 40, 17, 3...).
template <class P>
precision_run train_under(std::size_t replicas) {
  invariant s(ls::device_selection::first(replicas), ls::strategy_options{.micro_shard_rows = 4});
  auto m = s.replicate<mlp_dropout, P>(ls::seed{9});
  static_assert(std::is_same_v<decltype(m), invariant::model_type<mlp_dropout>>);  // fp32 masters, one model type
  precision_run out;
  out.precision = m.precision();
  out.plan = s.plan_of(m);
  for (const std::size_t rows : {40, 17, 3, 40, 64, 29}) {
    const auto st = ls::train_step(s, m, ls::adamw{.lr = 3e-3f}, ls::softmax_cross_entropy{},
                                   distributed(make_batch(rows, 70 + out.losses.size()), replicas));
    out.losses.push_back(st.loss_sum / static_cast<double>(st.count));
  }
  out.params = m.parameters_to_host();
  for (std::size_t r = 0; r < m.size(); ++r)
    out.identical = out.identical &&
                    std::equal(out.params.begin(), out.params.end(), m.replica(r).model().parameters().data());
  return out;
}

/// A fresh, empty directory for one test (named after it and this process).
std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

/// The rows of `b` as a pipeline of batches of `rows`.
auto in_memory(const ls::data::batch& b, std::size_t rows) {
  return ls::data::from_memory(std::vector<float>(b.features), b.width, std::vector<std::int32_t>(b.labels)) |
         ls::data::batched(rows);
}

/// Everything written to `f` (from its start); closes it.
std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string text;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) text.push_back(static_cast<char>(c));
  std::fclose(f);
  return text;
}

}  // namespace

TEST_CASE("mixed<bf16> on a strategy: identical replicas, the same bits on 1, 2 and 3 replicas, and fp32's course within bf16's precision") {
  const auto fp = train_under<ls::fp32>(1);
  const auto one = train_under<ls::mixed<ls::bf16>>(1);
  CHECK(fp.precision == ls::compute_precision::fp32);
  CHECK(one.precision == ls::compute_precision::bf16);
  for (const std::size_t replicas : {2, 3}) {
    CAPTURE(replicas);
    const auto many = train_under<ls::mixed<ls::bf16>>(replicas);
    CHECK(many.identical);
    CHECK(many.params == one.params);
    CHECK(many.losses == one.losses);
  }
  // Not fp32's bits, but fp32's course: the losses within a few bf16 roundings, the parameters close.
  CHECK(one.params != fp.params);
  for (std::size_t i = 0; i < fp.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(one.losses[i] - fp.losses[i]) <= 4 * 0x1p-8 * std::fabs(fp.losses[i]));
  }
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < fp.params.size(); ++i) {
    diff += std::pow(double(one.params[i]) - double(fp.params[i]), 2);
    norm += std::pow(double(fp.params[i]), 2);
  }
  CHECK(std::sqrt(diff) <= 0.02 * std::sqrt(norm));
  // Workers must agree on the policy: the collective plans differ in the field "precision".
  bool named = false;
  for (std::size_t i = 0; i < fp.plan.fields().size() && i < one.plan.fields().size(); ++i)
    if (fp.plan.fields()[i].value != one.plan.fields()[i].value) {
      CHECK(fp.plan.fields()[i].name == "precision");
      named = true;
      break;
    }
  CHECK(named);
}

TEST_CASE("fit names the model's precision and its kernels in the start-up line, and warns when bf16 is emulated") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  invariant s(ls::device_selection::first(1));
  auto m = s.replicate<mlp, ls::mixed<ls::bf16>>(ls::seed{1});
  ls::fit_options o;
  o.show_kernels = true;
  o.progress.stream = f;
  o.progress.live = false;
  (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, in_memory(make_batch(16, 1), 8), o);
  const std::string shown = read_all(f);
  CHECK(shown.find("lockstep: host GEMM " + ls::host_gemm_name() + ", loops " + ls::host_loops_name() + ", precision " +
                   ls::host_precision_description(ls::compute_precision::bf16) + "\n") != std::string::npos);
  // An emulated bf16 warns (and names the fix); native kernels do not.
  CHECK((shown.find("mixed<bf16> is emulated") != std::string::npos) == !ls::host_bf16_native());
}

TEST_CASE("a checkpoint records its precision policy and resumes under another, saying so") {
  namespace fs = std::filesystem;
  const fs::path dir = fresh_dir("precision_ckpt");
  const auto b = make_batch(32, 5);
  const auto data = [&] { return in_memory(b, 8); };
  invariant s(ls::device_selection::first(2));
  auto bf = s.replicate<mlp, ls::mixed<ls::bf16>>(ls::seed{3});
  (void)ls::fit(s, bf, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, data(),
                {.epochs = 1, .quiet = true, .checkpoint_dir = dir.string()});
  const auto newest = ls::checkpoint_manager(dir).latest();
  REQUIRE(newest.has_value());
  const ls::checkpoint_state st = ls::load_checkpoint(*newest);
  CHECK(st.precision == "mixed<bf16>");
  CHECK(st.parameters == bf.parameters_to_host());  // the fp32 masters, as trained

  // Resumed under fp32: the weights load as they are, and the resume line names both policies.
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  auto fp = s.replicate<mlp>(ls::seed{3});
  ls::fit_options o;
  o.epochs = 2;
  o.checkpoint_dir = dir.string();
  o.resume = true;
  o.progress.stream = f;
  o.progress.live = false;
  const ls::history h = ls::fit(s, fp, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, data(), o);
  const std::string shown = read_all(f);
  CHECK(h.resumed_from_step == 4);
  CHECK(shown.find("; written under mixed<bf16>, continuing under fp32") != std::string::npos);
  CHECK(ls::load_checkpoint(*ls::checkpoint_manager(dir).latest()).precision == "fp32");
  fs::remove_all(dir);
}

TEST_CASE("loss_scaler: 2^16 at first, doubles after 2000 finite updates, halves on an overflow, stays in [1, 2^24]") {
  ls::loss_scaler s;
  CHECK(s.scale() == 65536.0);
  for (int i = 0; i < 1999; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 65536.0);
  CHECK(s.update(false));  // the 2000th finite update in a row
  CHECK(s.scale() == 131072.0);
  CHECK(s.good_updates() == 0);
  for (int i = 0; i < 1000; ++i) CHECK(s.update(false));
  CHECK(s.update(true));  // an overflow halves and restarts the count
  CHECK(s.scale() == 65536.0);
  CHECK(s.good_updates() == 0);
  for (int i = 0; i < 1999; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 65536.0);  // 1000 + 1999 finite updates, but not 2000 in a row
  // Never above 2^24.
  ls::loss_scaler high;
  REQUIRE(high.restore(16777216.0, 1999, 0));
  CHECK(high.update(false));
  CHECK(high.scale() == 16777216.0);
  // Down to 1, then 50 overflows in a row at 1 stop the run (update returns false on the 50th).
  ls::loss_scaler low;
  for (int i = 0; i < 16; ++i) CHECK(low.update(true));
  CHECK(low.scale() == 1.0);
  for (int i = 0; i < 49; ++i) CHECK(low.update(true));
  CHECK(low.overflows_at_minimum() == 49);
  CHECK(!low.update(true));
  // A finite update resets the count at the minimum.
  ls::loss_scaler reset;
  REQUIRE(reset.restore(1.0, 0, 49));
  CHECK(reset.update(false));
  CHECK(reset.overflows_at_minimum() == 0);
  // restore refuses what no scaler can hold.
  CHECK(!reset.restore(3.0, 0, 0));
  CHECK(!reset.restore(0.5, 0, 0));
  CHECK(!reset.restore(33554432.0, 0, 0));
  CHECK(!reset.restore(2.0, 2000, 0));
  CHECK(!reset.restore(2.0, 0, 50));
}

TEST_CASE("mixed<fp16>: an overflow on one replica skips the update on every replica and halves the scale") {
  for (const std::size_t replicas : {1, 2, 3}) {
    CAPTURE(replicas);
    invariant s(ls::device_selection::first(replicas), ls::strategy_options{.micro_shard_rows = 4});
    auto m = s.replicate<mlp, ls::mixed<ls::fp16>>(ls::seed{9});
    CHECK(m.precision() == ls::compute_precision::fp16);
    // A first update at 2^16 may overflow already; train until one applies.
    std::size_t tries = 0;
    for (; tries < 20; ++tries)
      if (!ls::train_step(s, m, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                          distributed(make_batch(24, 300 + tries), replicas))
               .skipped)
        break;
    REQUIRE(tries < 20);
    const double scale = m.scaler().scale();
    const std::vector<float> before = m.parameters_to_host();
    // The last two rows (the last replica's shard) have large features (30, exact in fp16) and two
    // different labels: their logits saturate the softmax, so at least one row's gradient at its
    // label is -1, which the loss scale 2^16 takes past fp16's largest value (65504): the backward
    // GEMM's operand rounds to infinity and the reduced gradient is not finite.
    auto b = make_batch(24, 400);
    for (std::size_t f = 0; f < 784; ++f) b.features[22 * 784 + f] = b.features[23 * 784 + f] = 30.0f;
    b.labels[22] = 0;
    b.labels[23] = 1;
    const auto st = ls::train_step(s, m, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{}, distributed(b, replicas));
    CHECK(st.skipped);
    CHECK(st.loss_scale == scale);
    CHECK(m.scaler().scale() == scale / 2);
    CHECK(m.parameters_to_host() == before);
    for (std::size_t r = 0; r < m.size(); ++r)
      CHECK(std::equal(before.begin(), before.end(), m.replica(r).model().parameters().data()));
    // The next update runs at the halved scale and applies.
    const auto next = ls::train_step(s, m, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                                     distributed(make_batch(24, 401), replicas));
    CHECK(next.loss_scale == scale / 2);
    CHECK(!next.skipped);
    CHECK(m.parameters_to_host() != before);
  }
}

TEST_CASE("mixed<fp16> trains as fp32 does within fp16's precision, and a checkpoint keeps the loss scale") {
  namespace fs = std::filesystem;
  const fs::path dir = fresh_dir("fp16_ckpt");
  const auto b = make_batch(64, 8);
  const auto data = [&] { return in_memory(b, 16); };
  invariant s(ls::device_selection::first(2));
  auto fp = s.replicate<mlp>(ls::seed{3});
  auto h16 = s.replicate<mlp, ls::mixed<ls::fp16>>(ls::seed{3});
  const auto fp_h = ls::fit(s, fp, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{}, data(), {.epochs = 3, .quiet = true});
  const auto h16_h = ls::fit(s, h16, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{}, data(),
                             {.epochs = 3, .quiet = true, .checkpoint_dir = dir.string()});
  REQUIRE(h16_h.epochs.size() == 3);
  CHECK(h16_h.epochs.back().train_loss < h16_h.epochs.front().train_loss);
  CHECK(std::fabs(h16_h.epochs.back().train_loss - fp_h.epochs.back().train_loss) <= 0.05 * fp_h.epochs.back().train_loss);
  CHECK(h16.scaler().scale() <= ls::loss_scaler::initial_scale);
  // The checkpoint holds the scale; a mixed<fp16> model resumes with it, an fp32 one ignores it.
  const ls::checkpoint_state st = ls::load_checkpoint(*ls::checkpoint_manager(dir).latest());
  CHECK(st.precision == "mixed<fp16>");
  REQUIRE(st.has_loss_scale);
  CHECK(st.scaler.scale() == h16.scaler().scale());
  CHECK(st.scaler.good_updates() == h16.scaler().good_updates());
  auto resumed = s.replicate<mlp, ls::mixed<ls::fp16>>(ls::seed{3});
  ls::restore(resumed, static_cast<const ls::model_state&>(st));
  CHECK(resumed.scaler().scale() == h16.scaler().scale());
  CHECK(resumed.scaler().good_updates() == h16.scaler().good_updates());
  fs::remove_all(dir);
}

namespace {
/// The bytes of replica 0 of bench_step's config L (1024-4096-4096-1024, ReLU) after one SGD step
/// of a global batch of 512 under policy P, on one replica.
template <class P>
ls::memory_use config_l_bytes() {
  using config_l = ls::sequential<ls::dense<1024, 4096>, ls::relu, ls::dense<4096, 4096>, ls::relu, ls::dense<4096, 1024>>;
  ls::mirrored<ls::cpus> s(ls::device_selection::first(1));
  auto m = s.replicate<config_l, P>(ls::seed{3});
  ls::data::batch b;
  b.width = 1024;
  b.features.assign(512 * 1024, 0.25f);
  b.targets.assign(512 * 1024, 0.5f);
  b.target_width = 1024;
  for (std::uint64_t i = 0; i < 512; ++i) b.indices.push_back(i);
  (void)ls::train_step(s, m, ls::sgd{.lr = 1e-4f}, ls::mse{}, distributed(b, 1));
  return std::as_const(m.replica(0)).memory();
}

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1u << 20));
  return text;
}
}  // namespace

TEST_CASE("bytes per replica of config L under fp32 and mixed<bf16>: the bf16 weight copy, the GEMM operand buffers and the ReLU outputs kept in bf16 are the difference") {
  const ls::memory_use fp = config_l_bytes<ls::fp32>();
  const ls::memory_use bf = config_l_bytes<ls::mixed<ls::bf16>>();
  constexpr std::size_t params = 1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1024 + 1024;
  // The masters and gradients are fp32 under both policies.
  CHECK(fp.parameters == params * 4);
  CHECK(bf.parameters == fp.parameters);
  CHECK(bf.gradients == fp.gradients);
  // Activations: the two ReLUs' outputs (each dense layer applies its ReLU in its forward, so its
  // own output is not kept), the two gradient buffers, and the model's output; under mixed<bf16>
  // the ReLUs' outputs are kept in bf16 (each is read by the next dense layer's GEMMs).
  CHECK(fp.activations == (512 * (2 * 4096 + 2 * 4096) + 512 * 1024) * 4);
  CHECK(bf.activations == fp.activations - 512 * 2 * 4096 * 2);
  CHECK(bf.optimizer_state == fp.optimizer_state);
  CHECK(bf.other == fp.other);
  CHECK(fp.weight_copy == 0);
  CHECK(fp.gemm_operands == 0);
  if (ls::host_bf16_native()) {
    // The weights are read from the copy: only activations and output gradients are converted,
    // to 16 bits, the largest 512 x 4096.
    CHECK(bf.weight_copy == params * 2);
    CHECK(bf.gemm_operands == 2 * 512 * 4096 * 2);
  } else {
    // Emulated: no copy, and the operands rounded into fp32 buffers (the largest B a weight).
    CHECK(bf.weight_copy == 0);
    CHECK(bf.gemm_operands == (512 * 4096 + 4096 * 4096) * 4);
  }
  CHECK(bf.total() - fp.total() == bf.weight_copy + bf.gemm_operands - (fp.activations - bf.activations));
  std::string table = "config L (1024-4096-4096-1024, batch 512, SGD), MiB per replica:\n";
  const auto row = [&table](const char* part, std::size_t a, std::size_t b) {
    char line[96];
    std::snprintf(line, sizeof line, "  %-14s %8s %12s\n", part, mib(a).c_str(), mib(b).c_str());
    table += line;
  };
  table += "  part               fp32  mixed<bf16>\n";
  row("parameters", fp.parameters, bf.parameters);
  row("gradients", fp.gradients, bf.gradients);
  row("activations", fp.activations, bf.activations);
  row("weight copy", fp.weight_copy, bf.weight_copy);
  row("GEMM operands", fp.gemm_operands, bf.gemm_operands);
  row("other", fp.other, bf.other);
  row("total", fp.total(), bf.total());
  MESSAGE(table);
}

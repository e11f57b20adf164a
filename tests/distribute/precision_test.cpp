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
  const auto b = make_batch(16, 1);
  std::vector<float> x = b.features;
  std::vector<std::int32_t> y = b.labels;
  ls::fit_options o;
  o.show_kernels = true;
  o.progress.stream = f;
  o.progress.live = false;
  (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{},
                ls::data::from_memory(std::move(x), 784, std::move(y)) | ls::data::batched(8), o);
  std::rewind(f);
  std::string shown;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) shown.push_back(static_cast<char>(c));
  std::fclose(f);
  CHECK(shown.find("lockstep: host GEMM " + ls::host_gemm_name() + ", precision " +
                   ls::host_precision_description(ls::compute_precision::bf16) + "\n") != std::string::npos);
  // An emulated bf16 warns (and names the fix); native kernels do not.
  CHECK((shown.find("mixed<bf16> is emulated") != std::string::npos) == !ls::host_bf16_native());
}

TEST_CASE("a checkpoint records its precision policy and resumes under another, saying so") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lockstep_precision_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto b = make_batch(32, 5);
  const auto data = [&] {
    return ls::data::from_memory(std::vector<float>(b.features), 784, std::vector<std::int32_t>(b.labels)) |
           ls::data::batched(8);
  };
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
  std::rewind(f);
  std::string shown;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) shown.push_back(static_cast<char>(c));
  std::fclose(f);
  CHECK(h.resumed_from_step == 4);
  CHECK(shown.find("; written under mixed<bf16>, continuing under fp32") != std::string::npos);
  CHECK(ls::load_checkpoint(*ls::checkpoint_manager(dir).latest()).precision == "fp32");
  fs::remove_all(dir);
}

// The lockstep side of the interop tests (tests/interop/*.py): writes TensorBoard event files and
// safetensors files for Python's readers, and reads safetensors files PyTorch wrote.
//
//   interop_tool scalars DIR                  known scalars through io::tensorboard_writer
//   interop_tool fit DIR EXPECTED             a short fit with the tensorboard callback; EXPECTED
//                                             gets one line "tag step value" per scalar written
//   interop_tool restart DIR                  steps 0..9 in one file, then in a second file a restart
//                                             at step 6 and steps 6..9 again with values + 100
//   interop_tool count DIR                    one scalar per record, forever; prints each step
//                                             after its write returned (for the SIGKILL test)
//   interop_tool export FILE DTYPE IN OUT     trains the interop network a few steps, saves it to
//                                             FILE (f32|bf16|f16), writes its eval outputs on IN to OUT
//   interop_tool import FILE IN OUT           loads FILE into the interop network, writes its eval
//                                             outputs on IN to OUT
// IN and OUT are raw little-endian float32 rows of 64 and 5 values.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

/// The network the PyTorch side builds as nn.Sequential (see test_safetensors.py).
using interop_net =
    ls::sequential<ls::reshape<1, 8, 8>, ls::conv2d<4, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                   ls::residual<ls::conv2d<4, 3, 1, 1>, ls::batch_norm<>, ls::relu>, ls::max_pool2d<2>, ls::flatten,
                   ls::dropout<1, 5>, ls::dense<64, 16>, ls::relu, ls::dense<16, 5>>;
constexpr std::size_t in_width = 64, out_width = 5;

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && !in) throw std::runtime_error("cannot read " + path);
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

void write_floats(const std::string& path, const float* p, std::size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// Eval-mode outputs of parameters `stored` on the rows of file `in`, written to `out`.
void eval_outputs(const std::vector<float>& stored, const std::string& in, const std::string& out) {
  const std::vector<float> x = read_floats(in);
  const std::size_t rows = x.size() / in_width;
  ls::model<interop_net> m(ls::seed{1});
  std::copy(stored.begin(), stored.end(), m.parameters().data());
  ls::backend::host_context ctx;
  const float* y = m.forward(ctx, x.data(), rows, ls::pass_info{});
  write_floats(out, y, rows * out_width);
}

/// Synthetic training data for the interop network.
auto training_data() {
  const ls::counter_rng rng(5, 1);
  std::vector<float> f(96 * in_width);
  std::vector<std::int32_t> labels(96);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int32_t>(rng.u32(i) % out_width);
    for (std::size_t j = 0; j < in_width; ++j)
      f[i * in_width + j] = static_cast<float>(rng.normal(1000 + i * in_width + j) + (j % out_width == static_cast<std::size_t>(labels[i]) ? 1.0 : 0.0));
  }
  return ls::data::from_memory(std::move(f), in_width, std::move(labels)) | ls::data::batched(16);
}

int usage() {
  std::fprintf(stderr, "usage: interop_tool scalars DIR | fit DIR EXPECTED | count DIR | export FILE DTYPE IN OUT | import FILE IN OUT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3) return usage();
  const std::string cmd = argv[1];
  if (cmd == "scalars") {
    ls::io::tensorboard_writer w(argv[2]);
    for (std::int64_t step = 0; step < 100; ++step) {
      const double s = static_cast<double>(step);
      const ls::io::tensorboard_scalar v[] = {{"a/sine", std::sin(0.1 * s)}, {"a/square", s * s}, {"b/neg", -1.5 - s}};
      w.scalars(step * 3, v);
    }
    w.scalar("c/large_step", std::int64_t{1} << 40, 0.25);
    return 0;
  }
  if (cmd == "fit" && argc == 4) {
    ls::mirrored<ls::cpus> s(ls::device_selection::first(2));
    auto m = s.replicate<interop_net>(ls::seed{2});
    std::FILE* exp = std::fopen(argv[3], "w");
    if (!exp) throw std::runtime_error(std::string("cannot write ") + argv[3]);
    auto rate = std::make_shared<float>(0.0f);
    ls::callback expect_rate;  // sees the scheduled rate of each update, as the tensorboard callback does
    expect_rate.schedule = [rate](float r, std::uint64_t) { return *rate = r; };
    ls::callback expect_steps = ls::on_step_end([exp, rate](double loss, ls::training_control& c) {
      std::fprintf(exp, "step/loss %llu %.17g\nstep/lr %llu %.17g\n", static_cast<unsigned long long>(c.step), loss,
                   static_cast<unsigned long long>(c.step), static_cast<double>(*rate));
    });
    ls::callback expect_epochs = ls::on_epoch_end([exp](const ls::epoch_stats& e) {
      std::fprintf(exp, "epoch/loss %llu %.17g\nepoch/accuracy %llu %.17g\nepoch/lr %llu %.17g\n",
                   static_cast<unsigned long long>(e.epoch), e.train_loss, static_cast<unsigned long long>(e.epoch),
                   e.train_accuracy, static_cast<unsigned long long>(e.epoch), static_cast<double>(e.lr));
      std::fprintf(exp, "epoch/val_loss %llu %.17g\nepoch/val_accuracy %llu %.17g\nepoch/samples_per_second %llu %.17g\n",
                   static_cast<unsigned long long>(e.epoch), e.val_loss, static_cast<unsigned long long>(e.epoch),
                   e.val_accuracy, static_cast<unsigned long long>(e.epoch), e.samples_per_second);
      std::fprintf(exp, "epoch/val_top_k_accuracy %llu %.17g\n", static_cast<unsigned long long>(e.epoch),
                   e.val_top_k_accuracy);
    });
    const auto data = training_data();
    (void)ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, data,
                  {.epochs = 3,
                   .validation = data,
                   .callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 18}), expect_rate, expect_steps, expect_epochs,
                                 ls::tensorboard(argv[2])},
                   .quiet = true});
    std::fclose(exp);
    return 0;
  }
  if (cmd == "restart" && argc == 3) {
    {
      ls::io::tensorboard_writer w(argv[2]);
      for (std::int64_t step = 0; step < 10; ++step) w.scalar("restart", step, static_cast<double>(step));
    }
    ls::io::tensorboard_writer w(argv[2]);  // a new file in the same directory, named after the first
    w.session_start(6);
    for (std::int64_t step = 6; step < 10; ++step) w.scalar("restart", step, static_cast<double>(step + 100));
    return 0;
  }
  if (cmd == "count") {
    ls::io::tensorboard_writer w(argv[2]);
    for (std::int64_t step = 0;; ++step) {
      w.scalar("count", step, static_cast<double>(step));
      std::printf("%lld\n", static_cast<long long>(step));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (cmd == "export" && argc == 6) {
    const std::string d = argv[3];
    const auto dtype = d == "bf16"  ? ls::io::safetensors_dtype::bf16
                       : d == "f16" ? ls::io::safetensors_dtype::f16
                                    : ls::io::safetensors_dtype::f32;
    ls::mirrored<ls::cpus> s(ls::device_selection::first(2));
    auto m = s.replicate<interop_net>(ls::seed{3});
    (void)ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, training_data(), {.epochs = 2, .quiet = true});
    ls::save_safetensors(m, argv[2], {.dtype = dtype});
    std::vector<float> p = m.parameters_to_host();
    if (dtype != ls::io::safetensors_dtype::f32) {  // the outputs of the weights as stored
      auto back = p;
      ls::io::decode_safetensors<interop_net>(ls::io::encode_safetensors<interop_net>(p, 0, {.dtype = dtype}), back);
      p = back;
    }
    eval_outputs(p, argv[4], argv[5]);
    return 0;
  }
  if (cmd == "import" && argc == 5) {
    ls::mirrored<ls::cpus> s(ls::device_selection::first(1));
    auto m = s.replicate<interop_net>(ls::seed{4});
    ls::load_safetensors(m, argv[2]);
    eval_outputs(m.parameters_to_host(), argv[3], argv[4]);
    return 0;
  }
  return usage();
} catch (const std::exception& e) {
  std::fprintf(stderr, "interop_tool: %s\n", e.what());
  return 1;
}

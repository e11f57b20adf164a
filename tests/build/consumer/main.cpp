// Trains a tiny classifier for a few steps through the public API; exits non-zero unless the
// loss goes down.
#include <cstdio>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

int main() {
  using net = ls::sequential<ls::dense<2, 8>, ls::tanh, ls::dense<8, 2>>;
  ls::replica<net> rep(ls::host_context{1}, ls::seed{1});

  ls::data::batch b;
  b.width = 2;
  const ls::counter_rng rng(7, 0);
  for (std::uint64_t i = 0; i < 64; ++i) {
    const float x = rng.uniform(2 * i) * 2 - 1, y = rng.uniform(2 * i + 1) * 2 - 1;
    b.features.insert(b.features.end(), {x, y});
    b.labels.push_back(x + y > 0 ? 1 : 0);
    b.indices.push_back(i);
  }
  const ls::data::shard all = ls::data::whole(b);
  const ls::adam opt{.lr = 0.05f};
  double first = 0, last = 0;
  for (std::uint64_t step = 0; step < 20; ++step) {
    const ls::loss_sum l = rep.forward_backward(ls::softmax_cross_entropy{}, all, ls::pass_info::for_training(1, step));
    rep.apply(opt, ls::update_info{opt.lr, step + 1, 1.0 / double(l.count)});
    (step == 0 ? first : last) = l.sum / double(l.count);
  }
  std::printf("lockstep %d.%d.%d consumer: loss %.4f -> %.4f, host GEMM: %s\n", ls::version_major, ls::version_minor,
              ls::version_patch, first, last, ls::host_gemm_name().c_str());
  return last < first ? 0 : 1;
}

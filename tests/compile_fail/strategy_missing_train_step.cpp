// A strategy with everything evaluate needs but no train_step: fit names the missing member.
// expect: a strategy needs `template <class Optimizer, class Loss> lockstep::step_stats train_step\(Model& m
#include <lockstep/lockstep.hpp>

struct evaluation_only {
  using strategy_concept = lockstep::strategy_tag;
  using kind_type = lockstep::cpus;
  std::size_t num_replicas() const { return 1; }
  template <class F>
  auto run(F&& fn, const lockstep::data::distributed_batch& b) {
    return std::vector{fn(std::size_t{0}, b.shards.front())};
  }
  double reduce(lockstep::reduce_op, const std::vector<double>& v) const { return v.front(); }
};

int main() {
  namespace ls = lockstep;
  evaluation_only s;
  ls::replicated<ls::sequential<ls::dense<2, 2>>> m({ls::host_context{}}, ls::seed{1}, 0);
  auto data = ls::data::from_memory(std::vector<float>(4), 2, std::vector<std::int32_t>(2)) | ls::data::batched(2);
  (void)ls::fit(s, m, ls::sgd{}, ls::softmax_cross_entropy{}, data);
}

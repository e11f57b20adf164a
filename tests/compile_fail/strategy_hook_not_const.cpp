// A strategy whose optional is_chief hook is not const: it would be ignored silently, so fit names it.
// expect: a strategy's optional hook must be `bool is_chief\(\) const`
#include <lockstep/lockstep.hpp>

struct not_chief : lockstep::one_device<lockstep::cpu<0>> {
  bool is_chief() { return false; }  // not const
};

int main() {
  namespace ls = lockstep;
  not_chief s;
  auto m = s.replicate<ls::sequential<ls::dense<2, 2>>>(ls::seed{1});
  auto data = ls::data::from_memory(std::vector<float>(4), 2, std::vector<std::int32_t>(2)) | ls::data::batched(2);
  (void)ls::fit(s, m, ls::sgd{}, ls::softmax_cross_entropy{}, data);
}

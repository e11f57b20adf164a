// A strategy whose world() returns a type whose is_chief is not const: fit names the member.
// expect: a world needs `bool is_chief\(\) const`
#include <lockstep/lockstep.hpp>

struct my_world : lockstep::local_world {
  using lockstep::local_world::local_world;
  bool is_chief() { return true; }  // not const
};

struct with_world : lockstep::one_device<lockstep::cpu<0>> {
  my_world w{1};
  my_world& world() { return w; }
};

int main() {
  namespace ls = lockstep;
  with_world s;
  auto m = s.replicate<ls::sequential<ls::dense<2, 2>>>(ls::seed{1});
  auto data = ls::data::from_memory(std::vector<float>(4), 2, std::vector<std::int32_t>(2)) | ls::data::batched(2);
  (void)ls::fit(s, m, ls::sgd{}, ls::softmax_cross_entropy{}, data);
}

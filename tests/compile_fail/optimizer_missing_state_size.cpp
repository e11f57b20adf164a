// An optimiser without state_size: fit names the missing member.
// expect: an optimiser needs `std::size_t state_size\(std::size_t n\) const`
#include <lockstep/lockstep.hpp>

struct stateless {
  using optimizer_concept = lockstep::optimizer_tag;
  float lr = 0.1f;
  template <class T, class Ctx>
  void update(Ctx&, T*, const T*, T*, std::size_t, const lockstep::update_info&) const {}
};

int main() {
  namespace ls = lockstep;
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<ls::sequential<ls::dense<2, 2>>>(ls::seed{1});
  auto data = ls::data::from_memory(std::vector<float>(4), 2, std::vector<std::int32_t>(2)) | ls::data::batched(2);
  (void)ls::fit(s, m, stateless{}, ls::softmax_cross_entropy{}, data);
}

// A loss whose evaluate is not const: fit names the member and says why.
// expect: a loss needs `lockstep::loss_sum evaluate\(.*\) const` \(note the const\)
#include <lockstep/lockstep.hpp>

struct mutable_loss {
  using loss_concept = lockstep::loss_tag;
  static constexpr std::size_t scratch_per_row = 0;
  template <class T, class Ctx, class Shape>
  lockstep::loss_sum evaluate(Ctx&, const lockstep::loss_args<T, Ctx, Shape>& a) {
    return {0, a.rows(), 0};
  }
};

int main() {
  namespace ls = lockstep;
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<ls::sequential<ls::dense<2, 2>>>(ls::seed{1});
  auto data = ls::data::from_memory(std::vector<float>(4), 2, std::vector<std::int32_t>(2)) | ls::data::batched(2);
  (void)ls::fit(s, m, ls::sgd{}, mutable_loss{}, data);
}

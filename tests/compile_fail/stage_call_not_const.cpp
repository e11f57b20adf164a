// A pipeline stage whose operator() is not const: `dataset | stage` names the member.
// expect: a pipeline stage needs `template <class T> dataset<U> operator\(\)\(dataset<T> d\) const`
#include <lockstep/data.hpp>

struct passthrough : lockstep::data::closure<passthrough> {
  template <class T>
  lockstep::data::dataset<T> operator()(lockstep::data::dataset<T> d) { return d; }  // not const
};

int main() {
  auto d = lockstep::data::from_vector(std::vector<int>{1, 2, 3}) | passthrough{};
  (void)d;
}

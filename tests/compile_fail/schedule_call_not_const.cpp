// A learning-rate schedule whose call operator is not const: lr_schedule names the member.
// expect: a learning-rate schedule needs `float operator\(\)\(float base, std::uint64_t step\) const`
#include <lockstep/train.hpp>

struct halving {
  float operator()(float base, std::uint64_t step) { return base / static_cast<float>(1 + step); }  // not const
};

int main() { (void)lockstep::lr_schedule(halving{}); }

// mixed<fp16> needs loss scaling, which this version does not have: the message says so and names
// the policy to use instead.
// expect: lockstep::mixed<fp16> needs dynamic loss scaling, which this version does not have. use lockstep::mixed<lockstep::bf16>
// errors: 1
#include <lockstep/lockstep.hpp>

using net = lockstep::sequential<lockstep::dense<4, 2>>;

int main() {
  lockstep::mirrored<lockstep::cpus> strategy(lockstep::device_selection::first(1));
  auto model = strategy.replicate<net, lockstep::mixed<lockstep::fp16>>(lockstep::seed{1});
  (void)model;
}

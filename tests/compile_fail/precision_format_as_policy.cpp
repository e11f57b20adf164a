// A format where a policy belongs (bf16 for mixed<bf16>): the message names the policy to write.
// expect: bf16 and fp16 alone are formats, not policies: write lockstep::mixed<lockstep::bf16>
// errors: 1
#include <lockstep/lockstep.hpp>

using net = lockstep::sequential<lockstep::dense<4, 2>>;

int main() {
  lockstep::mirrored<lockstep::cpus> strategy(lockstep::device_selection::first(1));
  auto model = strategy.replicate<net, lockstep::bf16>(lockstep::seed{1});
  (void)model;
}

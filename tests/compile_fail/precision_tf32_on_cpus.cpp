// The tf32 policy on cpu replicas: the message names the policies cpu replicas have.
// expect: the tf32 policy is for gpu replicas .TF32 tensor cores.. cpu replicas compute in fp32, or in bf16 under lockstep::mixed<lockstep::bf16>
// errors: 1
#include <lockstep/lockstep.hpp>

using net = lockstep::sequential<lockstep::dense<4, 2>>;

int main() {
  lockstep::mirrored<lockstep::cpus> strategy(lockstep::device_selection::first(1));
  auto model = strategy.replicate<net, lockstep::tf32>(lockstep::seed{1});
  (void)model;
}

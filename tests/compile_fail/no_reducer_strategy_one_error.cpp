// A strategy over a CPU and a GPU: exactly one error, the reducer selection's, names the cause;
// the strategy built on the missing reducer adds none of its own.
// expect: no reducer for this device set: cpu<I> and gpu<I> devices cannot share one strategy
// errors: 1
#include <lockstep/lockstep.hpp>

int main() {
  lockstep::mirrored<lockstep::cpu<0>, lockstep::gpu<0>> s;
  (void)s;
}

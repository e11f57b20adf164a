// A CPU and a GPU in one device set: the message names that one cause.
// expect: no reducer for this device set: cpu<I> and gpu<I> devices cannot share one strategy
// errors: 1
#include <lockstep/distribute.hpp>

int main() { lockstep::select_reducer_t<lockstep::cpu<0>, lockstep::gpu<0>>* r = nullptr; (void)r; }

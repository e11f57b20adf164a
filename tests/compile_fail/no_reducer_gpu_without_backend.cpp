// Two GPUs in a build without the CUDA backend: the message names that one cause.
// expect: no reducer for this device set: gpu<I> devices need the CUDA backend
// errors: 1
#include <lockstep/distribute.hpp>

int main() { lockstep::select_reducer_t<lockstep::gpu<0>, lockstep::gpu<1>>* r = nullptr; (void)r; }

// The Fashion-MNIST example compiled by nvcc, so that `--device gpu` has the CUDA backend
// (LOCKSTEP_HAS_CUDA is defined by lockstep::cuda).
#include "../../examples/fashion_mnist/main.cpp"

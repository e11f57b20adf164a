// Links against lockstep::cuda (the CUDA runtime and cuBLAS) without using them: the link of a
// consumer's target to the component, from the consumer's own directory, is what is checked.
int main() { return 0; }

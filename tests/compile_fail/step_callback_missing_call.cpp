// A step callback without a call operator taking the step's loss: on_step_end names it.
// expect: a step callback needs `void operator\(\)\(double mean_loss\)`
#include <lockstep/train.hpp>

struct recorder {
  void operator()(const lockstep::epoch_stats&) const {}  // an epoch callback's signature
};

int main() { (void)lockstep::on_step_end(recorder{}); }

// An epoch callback without a call operator taking the epoch's statistics: on_epoch_end names it.
// expect: an epoch callback needs `void operator\(\)\(const lockstep::epoch_stats& stats\)`
#include <lockstep/train.hpp>

struct logger {
  void operator()(double) const {}  // a step callback's signature, not an epoch callback's
};

int main() { (void)lockstep::on_epoch_end(logger{}); }

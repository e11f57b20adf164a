// A reducer without reset(): the strategy built on it names the missing member.
// expect: a reducer needs `void reset\(\)`
#include <lockstep/lockstep.hpp>

struct no_reset {
  using reducer_concept = lockstep::reducer_tag;
  template <class... Ds>
  static constexpr bool supports = true;
  explicit no_reset(const lockstep::reducer_config&) {}
  std::size_t workspace_bytes(std::size_t) const { return 0; }
  void bind(std::size_t, void*, std::size_t) {}
  template <class Ctx, class T>
  void start(std::size_t, Ctx&, T*, std::size_t, std::size_t) {}
  template <class Ctx>
  void wait(std::size_t, Ctx&, std::size_t) {}
  template <class Ctx, class T>
  void broadcast(std::size_t, Ctx&, T*, std::size_t, std::size_t) {}
  void abort() {}
};

int main() {
  lockstep::basic_mirrored<no_reset, lockstep::determinism::run_to_run, lockstep::cpu<0>> s;
  (void)s;
}

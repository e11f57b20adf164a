// host_allreduce over a kind whose memory the host may not read (the archetype kind): the strategy
// refuses the reducer for the kind, at compile time.
// expect: this reducer does not serve this device kind
#include <lockstep/lockstep.hpp>
#include <lockstep/testing/archetypes/kind.hpp>

int main() {
  lockstep::basic_mirrored<lockstep::host_allreduce, lockstep::determinism::run_to_run, lockstep_archetypes::cells> s;
  (void)s;
}

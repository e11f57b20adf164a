// host_allreduce over a kind whose memory the host cannot read (a GPU's, or this one's): refused
// with a message that says why and what to use instead.
// expect: lockstep::host_allreduce sums memory the host can read, and this kind's device_memory says it cannot
#include <lockstep/distribute.hpp>

struct vram {
  using kind_type = vram;
};
template <>
struct lockstep::device_memory<vram> {
  static constexpr bool host_accessible = false;
  static void* allocate(std::size_t) { return nullptr; }
  static void deallocate(void*, std::size_t) noexcept {}
};
struct vram_context {
  using kind_type = vram;
};

int main() {
  lockstep::host_allreduce r(lockstep::reducer_config{.replicas = 1});
  vram_context ctx;
  float x = 0;
  r.start(0, ctx, &x, 1, 0);
}

#pragma once
/// @file context.hpp (testing/archetypes/kind)
/// The kind tag `cells` and its context.
/// The archetype device kind is built the way docs/architecture.md ("Adding a device kind") says
/// a new kind is added, in these files: context.hpp (the kind tag and its execution context),
/// kernels.hpp (the kernels layers, losses and optimisers call, found by argument-dependent
/// lookup on the context), memory.hpp (its memory), backend.hpp (its registration) and
/// reducer.hpp (its reducer and default selection); ../kind.hpp includes them all. Its memory is
/// host memory in fact, declared not host-accessible, so the library must treat it as device
/// memory; its kernels are naive loops. The backend suite (lockstep/testing/backend.hpp) checks it.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <lockstep/core/device.hpp>

namespace lockstep_archetypes {

/// The archetype kind: its memory is host memory in fact, but declared not host-accessible.
struct cells {
  using kind_type = cells;  ///< a kind is its own kind
};

/// Where a staged shard landed.
struct staged {
  const float* features = nullptr;       ///< features on the device
  const std::int32_t* labels = nullptr;  ///< labels on the device
  const float* targets = nullptr;        ///< targets on the device
};

/// The archetype context: activation and synchronisation counted, staging into its own buffers.
class context {
public:
  using kind_type = cells;  ///< the kind this context runs on
  void activate() const noexcept {}
  void synchronize() const noexcept {}
  staged stage_shard(const float* f, std::size_t nf, const std::int32_t* l, std::size_t nl, const float* t, std::size_t nt) {
    features_.assign(f, f + nf);
    labels_.assign(l ? l : nullptr, l ? l + nl : nullptr);
    targets_.assign(t ? t : nullptr, t ? t + nt : nullptr);
    return {features_.data(), l ? labels_.data() : nullptr, t ? targets_.data() : nullptr};
  }

private:
  std::vector<float> features_, targets_;
  std::vector<std::int32_t> labels_;
};

}  // namespace lockstep_archetypes

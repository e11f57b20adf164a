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

#include <lockstep/backend/readback.hpp>
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

/// The archetype context: activation and synchronisation counted, staging into its own buffers,
/// and deferred readback (optional for a kind; lockstep/backend/readback.hpp): its softmax
/// cross-entropy (kernels.hpp) puts each loss's totals into the current page while deferral is
/// on, and the strategy collects a page one step after sealing it.
class context {
public:
  using kind_type = cells;  ///< the kind this context runs on
  void activate() const noexcept {}
  void synchronize() const noexcept {}
  /// Deferral on or off for the losses evaluated next.
  void set_defer_readback(bool on) noexcept { defer_ = on; }
  /// True while losses defer their readback.
  [[nodiscard]] bool defers_readback() const noexcept { return defer_; }
  /// Puts one loss's totals into the current page (its "copy": the memory is the host's).
  void defer_totals(double loss, double hits) const {
    pages_[page_].push_back(loss);
    pages_[page_].push_back(hits);
  }
  /// Closes the current page; the other one becomes current.
  void readback_seal() noexcept {
    sealed_[page_] = true;
    page_ ^= 1;
  }
  /// The sealed page of the step before, summed in order; frees it (evaluations 0: none sealed).
  [[nodiscard]] lockstep::backend::readback_totals readback_collect() {
    lockstep::backend::readback_totals t;
    const int p = page_ ^ 1;
    if (!sealed_[p]) return t;
    for (std::size_t i = 0; i + 1 < pages_[p].size(); i += 2) t.add(pages_[p][i], pages_[p][i + 1]);
    pages_[p].clear();
    sealed_[p] = false;
    return t;
  }
  /// Drops the current page.
  void readback_discard() noexcept { pages_[page_].clear(); }
  /// Drops both pages and turns deferral off.
  void readback_reset() noexcept {
    for (int p = 0; p < 2; ++p) {
      pages_[p].clear();
      sealed_[p] = false;
    }
    page_ = 0;
    defer_ = false;
  }
  staged stage_shard(const float* f, std::size_t nf, const std::int32_t* l, std::size_t nl, const float* t, std::size_t nt) {
    features_.assign(f, f + nf);
    labels_.assign(l ? l : nullptr, l ? l + nl : nullptr);
    targets_.assign(t ? t : nullptr, t ? t + nt : nullptr);
    return {features_.data(), l ? labels_.data() : nullptr, t ? targets_.data() : nullptr};
  }

private:
  mutable std::vector<double> pages_[2];  // (loss, hits) pairs of the current step and the one before
  bool sealed_[2] = {false, false};
  int page_ = 0;
  bool defer_ = false;
  std::vector<float> features_, targets_;
  std::vector<std::int32_t> labels_;
};

}  // namespace lockstep_archetypes

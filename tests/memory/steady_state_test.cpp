// A steady-state training step allocates nothing: this binary replaces the global allocation
// functions with counting ones and measures a window of training steps after a warm-up.
// In the LOCKSTEP_HOST_GEMM=onednn build, the few small blocks oneDNN allocates inside each of its
// primitive executions (recognised by the caller's address lying in libdnnl) are counted apart and
// reported; everything else must still allocate nothing.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/layers/conv.hpp>
#include <lockstep/lockstep.hpp>

namespace {
std::atomic<std::size_t> allocation_count{0};
std::atomic<std::size_t> onednn_allocation_count{0};
thread_local bool counting = false;

void* counted_allocate(std::size_t n, std::size_t align, [[maybe_unused]] const void* caller) {
  if (counting) {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
    if (lockstep::backend::detail::onednn_owns_code(caller))
      onednn_allocation_count.fetch_add(1, std::memory_order_relaxed);
    else
#endif
      allocation_count.fetch_add(1, std::memory_order_relaxed);
  }
  if (n == 0) n = 1;
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n);
  } else {
    const std::size_t rounded = (n + align - 1) / align * align;
    p = std::aligned_alloc(align, rounded);
  }
  if (!p) throw std::bad_alloc();
  return p;
}

/// Counts the allocations made by the calling thread while it lives.
class allocation_window {
public:
  allocation_window() {
    allocation_count.store(0);
    onednn_allocation_count.store(0);
    counting = true;
  }
  ~allocation_window() { counting = false; }
  allocation_window(const allocation_window&) = delete;
  allocation_window& operator=(const allocation_window&) = delete;
  std::size_t count() const { return allocation_count.load(); }
  std::size_t onednn_count() const { return onednn_allocation_count.load(); }
};
}  // namespace

// __builtin_return_address(0) is the code that asked for the memory when the call is not inlined,
// as every call from libdnnl is (these stay inlinable, so that clang does not elide the new/delete
// pair of the first test case).
void* operator new(std::size_t n) {
  return counted_allocate(n, alignof(std::max_align_t), __builtin_return_address(0));
}
void* operator new[](std::size_t n) {
  return counted_allocate(n, alignof(std::max_align_t), __builtin_return_address(0));
}
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_allocate(n, static_cast<std::size_t>(a), __builtin_return_address(0));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_allocate(n, static_cast<std::size_t>(a), __builtin_return_address(0));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace ls = lockstep;

namespace {
ls::data::batch make_batch(std::size_t rows, std::size_t width, std::size_t classes, std::uint64_t seed) {
  ls::data::batch b;
  b.width = width;
  b.features.resize(rows * width);
  b.labels.resize(rows);
  b.indices.resize(rows);
  const ls::counter_rng rng(seed, 1);
  for (std::size_t i = 0; i < rows * width; ++i) b.features[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels[r] = static_cast<std::int32_t>(rng.u32(1'000'000 + r) % classes);
    b.indices[r] = r;
  }
  return b;
}

ls::data::batch make_regression_batch(std::size_t rows, std::size_t width, std::size_t outputs) {
  ls::data::batch b;
  b.width = width;
  b.target_width = outputs;
  b.features.resize(rows * width);
  b.targets.resize(rows * outputs);
  b.indices.resize(rows);
  const ls::counter_rng rng(3, 3);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = rng.uniform(i);
  for (std::size_t i = 0; i < b.targets.size(); ++i) b.targets[i] = rng.uniform(100000 + i);
  for (std::size_t r = 0; r < rows; ++r) b.indices[r] = r;
  return b;
}
}  // namespace

TEST_CASE("the counting allocator sees allocations in its window") {
  allocation_window w;
  std::vector<int>* v = new std::vector<int>(10);
  delete v;
  CHECK(w.count() == 2);
}

TEST_CASE_TEMPLATE("a steady-state replica step allocates nothing", T, float, double) {
  using net = ls::sequential<ls::dense<12, 16>, ls::relu, ls::dropout<1, 4>, ls::dense<16, 8>, ls::gelu,
                             ls::sequential<ls::dense<8, 5>, ls::tanh>, ls::dense<5, 4>>;
  ls::replica<net, ls::cpu<0>, T> rep(ls::host_context{1}, ls::seed{9});
  const ls::data::batch big = make_batch(33, 12, 4, 1);
  const ls::data::batch small = make_batch(20, 12, 4, 2);
  const auto shards = ls::data::split(big, 2);
  // shards are made before the window: data::whole and data::split return vectors
  const ls::data::shard big_all = ls::data::whole(big), small_all = ls::data::whole(small);
  const ls::adam opt{.lr = 1e-3f};
  const ls::softmax_cross_entropy loss;

  auto step = [&](const ls::data::shard& s, std::uint64_t k) {
    ls::pass_info info;
    info.seed = 5;
    info.step = k;
    const ls::loss_sum l = rep.forward_backward(loss, s, info);
    rep.apply(opt, ls::update_info{opt.lr, k + 1, 1.0 / double(s.global_size)});
    return l;
  };
  // warm-up at the largest shard: buffers and optimiser state are created here
  step(big_all, 0);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  // The oneDNN GEMM creates (and allocates) a primitive on the first GEMM of each shape, so every
  // shard size runs once before the window; lockstep's own buffers were all sized above.
  {
    allocation_window first_shapes;
    step(shards[0], 0);
    step(shards[1], 0);
    step(small_all, 0);
    (void)rep.predict(small_all, ls::pass_info{});
    (void)rep.evaluate(loss, big_all, ls::pass_info{});
    const std::size_t own = first_shapes.count(), onednn = first_shapes.onednn_count();
    if constexpr (std::is_same_v<T, float>)
      CHECK(rep.context().gemm_cache().primitives() > 0);  // the float GEMMs went through oneDNN
    MESSAGE("allocations at the first step of each new shard size: " << own << " (inside oneDNN: " << onednn << ")");
  }
#endif

  std::size_t allocations = 0;
  double loss_total = 0;
  {
    allocation_window w;
    for (std::uint64_t k = 1; k <= 6; ++k) {
      loss_total += step(big_all, k).sum;
      loss_total += step(shards[k % 2], k).sum;  // smaller shards reuse the same buffers
      loss_total += step(small_all, k).sum;
      (void)rep.predict(small_all, ls::pass_info{});
      loss_total += rep.evaluate(loss, big_all, ls::pass_info{}).sum;
    }
    allocations = w.count();
    const std::size_t onednn = w.onednn_count();
    if (onednn > 0) MESSAGE("allocations inside oneDNN's primitive executions: " << onednn);
  }
  CHECK(allocations == 0);
  CHECK(std::isfinite(loss_total));
}

TEST_CASE("a steady-state step of a small CNN allocates nothing, under fp32 and under mixed<bf16>") {
  // The second convolution has 8 input channels: in the oneDNN build it runs through oneDNN's
  // convolution primitives (created at the first step of each batch size; bf16 ones where the CPU
  // has bf16 instructions), the first through im2col.
  using net = ls::sequential<ls::reshape<2, 9, 7>, ls::conv2d<8, 3, 1, 1>, ls::relu, ls::max_pool2d<2>,
                             ls::conv2d<3, 3, 2, 1>, ls::avg_pool2d<2, 1>, ls::flatten, ls::dense<3, 5>>;
  for (const ls::compute_precision policy : {ls::compute_precision::fp32, ls::compute_precision::bf16}) {
    const std::string policy_name(ls::precision_name(policy));
    CAPTURE(policy_name);
    ls::replica<net> rep(ls::host_context{1, true, policy}, ls::seed{4});
    const ls::data::batch big = make_batch(11, 126, 5, 7);
    const ls::data::batch small = make_batch(4, 126, 5, 8);
    const ls::data::shard big_all = ls::data::whole(big), small_all = ls::data::whole(small);
    const ls::adam opt{.lr = 1e-3f};
    const ls::softmax_cross_entropy loss;
    auto step = [&](const ls::data::shard& s, std::uint64_t k) {
      const ls::loss_sum l = rep.forward_backward(loss, s, ls::pass_info::for_training(2, k));
      rep.apply(opt, ls::update_info{opt.lr, k + 1, 1.0 / double(s.global_size)});
      return l.sum;
    };
    step(big_all, 0);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
    step(small_all, 0);  // oneDNN creates its GEMM and convolution primitives at the first call of each shape
#endif
    std::size_t allocations = 0;
    double loss_total = 0;
    {
      allocation_window w;
      for (std::uint64_t k = 1; k <= 5; ++k) {
        loss_total += step(big_all, k);
        loss_total += step(small_all, k);
      }
      allocations = w.count();
    }
    CHECK(allocations == 0);
    CHECK(std::isfinite(loss_total));
  }
}

TEST_CASE("a steady-state mse step with sgd momentum allocates nothing") {
  using net = ls::sequential<ls::dense<6, 9>, ls::sigmoid, ls::dense<9, 3>>;
  ls::replica<net> rep(ls::host_context{1}, ls::seed{1});
  const ls::data::batch b = make_regression_batch(17, 6, 3);
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-4f};
  const ls::mse loss;
  rep.reserve(17);
  const ls::data::shard all = ls::data::whole(b);
  auto step = [&](std::uint64_t k) {
    (void)rep.forward_backward(loss, all, ls::pass_info::for_training(1, k));
    rep.apply(opt, ls::update_info{opt.lr, k + 1, 1.0 / 17});
  };
  step(0);
  std::size_t allocations = 0;
  {
    allocation_window w;
    for (std::uint64_t k = 1; k < 8; ++k) step(k);
    allocations = w.count();
    const std::size_t onednn = w.onednn_count();
    if (onednn > 0) MESSAGE("allocations inside oneDNN's primitive executions: " << onednn);
  }
  CHECK(allocations == 0);
}

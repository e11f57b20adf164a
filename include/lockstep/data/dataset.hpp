#pragma once
/// @file dataset.hpp
/// `dataset<T>`: a pipeline as a factory of per-epoch generators, the pipe-closure base that
/// stages derive from, and the generic sources (a vector, a user coroutine, a user lambda).

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/generator.hpp>

namespace lockstep::data {

/// A pipeline: a copyable factory that builds the generator of one epoch. `epoch(e)` may be
/// called any number of times; every randomised stage derives its randomness from (seed, e), so
/// `epoch(e)` yields the same sequence each time it is called.
/// @tparam T the element type the pipeline yields.
template <class T>
class dataset {
public:
  /// The element type.
  using value_type = T;
  /// The type-erased factory: epoch number -> generator of that epoch.
  using factory_type = std::function<generator<T>(std::uint64_t)>;

  /// An empty dataset (calling epoch() on it throws config_error).
  dataset() = default;
  /// Wraps a factory `f(epoch) -> generator<T>`.
  explicit dataset(factory_type f) : make_(std::move(f)) {}

  /// The generator of epoch `e` (lazy: nothing runs until it is iterated).
  [[nodiscard]] generator<T> epoch(std::uint64_t e = 0) const {
    if (!make_) throw config_error("lockstep::data::dataset: epoch() called on an empty dataset");
    return make_(e);
  }
  /// True when the dataset has a factory.
  explicit operator bool() const noexcept { return static_cast<bool>(make_); }

private:
  factory_type make_;
};

/// True for specialisations of dataset.
template <class D>
inline constexpr bool is_dataset_v = false;
/// True for specialisations of dataset.
template <class T>
inline constexpr bool is_dataset_v<dataset<T>> = true;

/// Base of every pipeline stage (CRTP): a closure is a function object dataset -> dataset that
/// can be applied with `d | stage` and chained with `stage_a | stage_b` into a new closure.
/// @tparam Derived the stage type.
template <class Derived>
struct closure {};

/// A type derived from closure<itself>.
template <class C>
concept pipe_closure = std::derived_from<std::remove_cvref_t<C>, closure<std::remove_cvref_t<C>>>;

/// A pipeline stage for elements of type T: a closure (derived from `closure<C>`) whose
/// `operator()` takes a `dataset<T>` and returns a dataset (of T or of another type). Rules a stage
/// keeps (docs/extending.md): every upstream element is passed on at most once and none is dropped
/// silently; the order of `epoch(e)` depends only on the upstream and (seed, e); exceptions thrown
/// by the stage's coroutine reach the consumer.
template <class C, class T>
concept pipeline_stage = pipe_closure<C> && std::invocable<const std::remove_cvref_t<C>&, dataset<T>> &&
                         is_dataset_v<std::invoke_result_t<const std::remove_cvref_t<C>&, dataset<T>>>;

namespace detail {
/// Checks stage C for a dataset<T> member by member, so that a stage that lacks one is told which.
template <class C, class T>
constexpr bool check_stage() {
  static_assert(pipe_closure<C>, "lockstep::data: a pipeline stage derives from `lockstep::data::closure<Self>`");
  static_assert(std::invocable<const C&, dataset<T>>,
                "lockstep::data: a pipeline stage needs `template <class T> dataset<U> operator()(dataset<T> d) const` "
                "accepting the elements of the dataset it is applied to (note the const)");
  if constexpr (std::invocable<const C&, dataset<T>>)
    static_assert(is_dataset_v<std::remove_cvref_t<std::invoke_result_t<const C&, dataset<T>>>>,
                  "lockstep::data: a pipeline stage's `operator()(dataset<T>) const` must return a lockstep::data::dataset");
  return true;  // each missing member was named above
}
}  // namespace detail

/// Applies a stage to a dataset: `d | stage` is `stage(d)`. A type that is not a pipeline_stage
/// for T is told which member it lacks.
template <class T, class C>
auto operator|(dataset<T> d, const C& c) {
  static_assert(detail::check_stage<C, T>());
  return c(std::move(d));
}

/// Two closures applied one after the other; itself a closure.
template <class First, class Second>
struct composed : closure<composed<First, Second>> {
  First first;    ///< applied first
  Second second;  ///< applied to the result of first
  /// Applies first, then second (each through `|`, which names what a stage lacks).
  template <class D>
  auto operator()(D d) const {
    return (std::move(d) | first) | second;
  }
};

/// Chains two stages into one reusable closure.
template <pipe_closure A, pipe_closure B>
auto operator|(A a, B b) {
  return composed<std::remove_cvref_t<A>, std::remove_cvref_t<B>>{{}, std::move(a), std::move(b)};
}

namespace detail {
template <class T>
generator<T> vector_source(std::shared_ptr<const std::vector<T>> values) {
  for (const T& v : *values) co_yield v;
}

template <class T, class F>
generator<T> function_source(F f) {
  while (true) {
    std::optional<T> v = f();
    if (!v) co_return;
    co_yield std::move(*v);
  }
}

template <class G>
struct generator_value;
template <class T>
struct generator_value<generator<T>> {
  using type = T;
};
}  // namespace detail

/// A dataset that yields copies of the given values in order, every epoch.
template <class T>
dataset<T> from_vector(std::vector<T> values) {
  auto shared = std::make_shared<const std::vector<T>>(std::move(values));
  return dataset<T>{[shared](std::uint64_t) { return detail::vector_source<T>(shared); }};
}

/// A dataset from a user coroutine: `f(epoch)` or `f()` returns a generator<T>; it is called once
/// per epoch. Exceptions thrown by the coroutine reach the consumer.
template <class F>
  requires std::invocable<const F&, std::uint64_t> || std::invocable<const F&>
auto from_generator(F f) {
  if constexpr (std::invocable<const F&, std::uint64_t>) {
    using G = std::invoke_result_t<const F&, std::uint64_t>;
    using T = typename detail::generator_value<std::remove_cvref_t<G>>::type;
    return dataset<T>{[f = std::move(f)](std::uint64_t e) { return f(e); }};
  } else {
    using G = std::invoke_result_t<const F&>;
    using T = typename detail::generator_value<std::remove_cvref_t<G>>::type;
    return dataset<T>{[f = std::move(f)](std::uint64_t) { return f(); }};
  }
}

/// A dataset from a lambda: every epoch starts from a fresh copy of `f` and calls it until it
/// returns an empty std::optional.
template <class F>
  requires std::copy_constructible<F>
auto from_function(F f) {
  using O = std::invoke_result_t<F&>;
  using T = typename O::value_type;
  return dataset<T>{[f = std::move(f)](std::uint64_t) { return detail::function_source<T, F>(f); }};
}

}  // namespace lockstep::data

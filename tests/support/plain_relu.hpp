// relu as an activation that never fuses into the layer before it (no grad_from_output): the same
// function and gradient as lockstep::relu on every device, so a network with it computes what the
// same network with relu computes with every layer apart. The reference of the fusion tests.
#pragma once

#include <lockstep/config.hpp>
#include <lockstep/layers/activations.hpp>

namespace test_support {

/// relu_fn's f, df and grad, without grad_from_output.
struct plain_relu_fn {
  template <class T> LOCKSTEP_HD static T f(T x) { return lockstep::relu_fn::f(x); }
  template <class T> LOCKSTEP_HD static T df(T x, T y) { return lockstep::relu_fn::df(x, y); }
  template <class T> LOCKSTEP_HD static T grad(T x, T y, T dy) { return lockstep::relu_fn::grad(x, y, dy); }
};
/// The activation layer of plain_relu_fn.
using plain_relu = lockstep::activation<plain_relu_fn>;

}  // namespace test_support

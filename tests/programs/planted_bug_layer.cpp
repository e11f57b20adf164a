// The layer conformance suite run on a layer with one planted bug: its backward forgets the scale
// in the input gradient (dx = dy instead of dy * a). The suite must fail, and its whole report
// must stay short and give numbers: the first failing elements of the one check that fails, with
// the analytic and numeric values, their difference and the tolerance, then how many more
// (checked by programs/planted_bug_layer_report, see programs.cmake).
#include <doctest/doctest.h>

#include <cstddef>

#include <lockstep/layers/layer.hpp>
#include <lockstep/testing/layer.hpp>

#include "support/scale_shift.hpp"

namespace planted {

/// y = x * a + b per feature, whose backward forgets a in the input gradient.
using scale_shift_bug = test_support::scale_shift<test_support::scale_shift_defect::dx_without_scale>;

}  // namespace planted

TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, lockstep::bind_t<planted::scale_shift_bug, 7>);

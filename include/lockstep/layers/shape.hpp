#pragma once
/// @file shape.hpp (layers)
/// The row shapes now live in core/shape.hpp, below every layer and loss; this header keeps the
/// old include path working.

#include <lockstep/core/shape.hpp>

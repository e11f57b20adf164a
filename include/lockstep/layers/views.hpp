#pragma once
/// @file views.hpp (layers)
/// The typed views now live in core/views.hpp, below every layer and loss; this header keeps the
/// old include path working.

#include <lockstep/core/views.hpp>

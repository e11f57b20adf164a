#pragma once
/// @file images.hpp
/// The image component of the input pipeline (CMake target lockstep::images, which links libpng
/// and libjpeg-turbo): PNG and JPEG decoders and the index-first image sources, image_folder and
/// tar_shards (WebDataset layout). The rest of lockstep never includes it, so a program without
/// images needs neither library.

#include <lockstep/data/image_decode.hpp>
#include <lockstep/data/image_folder.hpp>
#include <lockstep/data/image_options.hpp>
#include <lockstep/data/jpeg.hpp>
#include <lockstep/data/png.hpp>
#include <lockstep/data/webdataset.hpp>

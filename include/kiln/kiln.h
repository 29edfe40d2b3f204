// Kiln's public API in one include.
#pragma once

#include "kiln/core/device.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops.h"

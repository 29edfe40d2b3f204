#pragma once

#include "kiln/core/tensor.h"

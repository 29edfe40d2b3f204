// Every op Kiln offers, grouped by kind. Ops validate their arguments (throwing kiln::Error that names the
// op, the shapes and what was expected), allocate their outputs and dispatch to the device's kernels.
#pragma once

#include "kiln/ops/attention.h"    // scaled_dot_product_attention (tiled, online softmax)
#include "kiln/ops/collective.h"   // all_reduce_sum, all_gather over the process group
#include "kiln/ops/elementwise.h"  // unary, binary with broadcasting and promotion, where, clamp, casts
#include "kiln/ops/layout.h"       // concat, split, stack, embedding, upsampling, rope
#include "kiln/ops/linalg.h"       // matmul, linear, conv2d
#include "kiln/ops/nn.h"           // softmax, layer_norm, rms_norm, group_norm
#include "kiln/ops/reduction.h"    // sum, mean, max, var

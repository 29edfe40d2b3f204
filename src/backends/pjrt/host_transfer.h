// Moving tensors between the host and PJRT devices (the "copy" op when its operands are on two devices). The
// bytes travel as one dense array; views, broadcasts and dtype conversions are done on the device side by the
// copy op's StableHLO, or on the host for a strided host destination.
#pragma once

#include "kiln/core/tensor.h"

namespace kiln::pjrt {

void copy_host_to_device(const Tensor& src, const Tensor& dst);
void copy_device_to_host(const Tensor& src, const Tensor& dst);
// Between two PJRT devices (of one plugin or two), through the host.
void copy_device_to_host_to_device(const Tensor& src, const Tensor& dst);

}  // namespace kiln::pjrt

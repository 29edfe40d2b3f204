// Kiln's public API in one include: tensors and ops, execution contexts and modes, the pipelines (by class
// name: DiffusionPipeline::from_pretrained, the registry of families), their requests and images, the process
// group of tensor parallelism, and the counters. Internals (device runtimes, kernels, graphs) stay out of it.
// A family's own classes, for their stages (FluxPipeline::encode_prompt, ...), come from its header:
// kiln/families/<family>/.
#pragma once

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/core/tensor.h"
#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/io/model_ref.h"
#include "kiln/ops.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/image.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/pipelines/pipeline_request.h"
#include "kiln/pipelines/request_fields.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/device_ledger.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"

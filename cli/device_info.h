// `kiln info --devices`: every device type this build knows, with its devices or why there are none.
#pragma once

namespace kiln::cli {

void print_devices();

}  // namespace kiln::cli

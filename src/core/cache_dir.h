// Where Kiln keeps what it measures, compiles or fetches between runs (per-host rates, the PJRT header and
// CPU plugin that scripts/fetch_pjrt.sh extracts): one rule, shared by every user and by the shell scripts.
#pragma once

#include <string>

namespace kiln {

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln (the first that is set and non-empty);
// "" when none is. scripts/fetch_pjrt.sh spells the same rule in shell: change both together.
std::string cache_dir();

}  // namespace kiln

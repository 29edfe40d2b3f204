// The constructors of plugin/'s Client and Topology, declared where every build sees them: pjrt_support.cpp
// calls them only in a build whose plugin/ was compiled (`if constexpr`), so a build without the PJRT C API
// header type-checks the same calls and needs no stand-in definitions that could drift from these.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/pjrt/client_options.h"
#include "backends/pjrt/pjrt_client.h"
#include "backends/pjrt/pjrt_topology.h"

namespace kiln::pjrt {

std::shared_ptr<Client> create_plugin_client(const std::string& plugin_path,
                                             const std::vector<ClientOption>& options);
std::shared_ptr<Topology> create_plugin_topology(const std::string& plugin_path, const std::string& name,
                                                 const std::vector<ClientOption>& options);

}  // namespace kiln::pjrt

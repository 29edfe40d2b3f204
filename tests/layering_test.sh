#!/usr/bin/env bash
# The layering has no back-references (docs/architecture.md): a layer includes only itself and the layers
# below it. Each rule: the folders of one layer, and the include prefixes they must not use.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
status=0
check() {
  local layer="$1" forbidden="$2"
  shift 2
  local hits
  hits=$(cd "$root" && grep -rnE "#include \"(${forbidden})" "$@" 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "layering: $layer includes a layer above it:"
    echo "$hits"
    status=1
  fi
}
above_core='runtime/|kiln/runtime/|graph/|backends/|kiln/ops|ops/|nn/|kiln/nn/|models/|kiln/models/|pipelines/|kiln/pipelines/|dist/|kiln/dist/|io/|kiln/io/|cli/'
above_runtime='graph/|backends/|kiln/ops|ops/|nn/|kiln/nn/|models/|kiln/models/|pipelines/|kiln/pipelines/|dist/|kiln/dist/|io/|kiln/io/|cli/'
above_models='pipelines/|kiln/pipelines/|families/|kiln/families/|cli/'
# The pipelines' skeleton and the registry stand below the families: src/families/registry.cpp provides the list
# the registry declares, and no pipeline file names a family.
above_pipelines='families/|kiln/families/|cli/'
above_lora='pipelines/|kiln/pipelines/|families/|kiln/families/|cli/'
check core "$above_core" src/core include/kiln/core
check runtime "$above_runtime" src/runtime include/kiln/runtime
check "ops, nn, models, graph, backends" "$above_models" src/ops src/nn src/models src/graph src/backends \
  include/kiln/ops include/kiln/nn include/kiln/models
check pipelines "$above_pipelines" src/pipelines include/kiln/pipelines
check lora "$above_lora" src/lora include/kiln/lora
check "the library" 'cli/' src include
[ $status -eq 0 ] && echo "layering: no back-references"
exit $status

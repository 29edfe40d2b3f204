#include "kiln/io/output_file.h"

#include "io/atomic_file.h"

namespace kiln::io {

void check_output_writable(const std::string& path) {
  // Creating the temporary file is the whole test; the destructor removes it again.
  const AtomicFile probe(path);
}

}  // namespace kiln::io

// Byte counts for people: what Kiln prints about memory (offload plans, `kiln info`, logs) in one format.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// Binary units, with the precision that tells sizes from tiny test models to full checkpoints apart:
// "512 B", "264.2 KiB", "51.0 MiB", "12.00 GiB", "1.50 TiB". Negative counts keep their sign.
std::string format_bytes(int64_t bytes);

}  // namespace kiln

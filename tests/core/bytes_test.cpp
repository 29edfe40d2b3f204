// format_bytes: the one format every size Kiln prints comes in (the CLI tests match it, e.g. "264.2 KiB").
#include <gtest/gtest.h>

#include "kiln/core/bytes.h"

namespace kiln {
namespace {

TEST(FormatBytes, PicksTheUnitAndItsPrecision) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(270541), "264.2 KiB");
  EXPECT_EQ(format_bytes(int64_t{51} << 20), "51.0 MiB");
  EXPECT_EQ(format_bytes(int64_t{12} << 30), "12.00 GiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 39), "1.50 TiB");
  EXPECT_EQ(format_bytes(int64_t{2048} << 40), "2048.00 TiB") << "no unit above TiB";
  EXPECT_EQ(format_bytes(-1536), "-1.5 KiB");
}

}  // namespace
}  // namespace kiln

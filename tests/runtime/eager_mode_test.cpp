// Mode selection: the process mode, per-thread guards (innermost wins, other threads unaffected) and the
// environment default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <latch>
#include <optional>
#include <string>
#include <thread>

#include "kiln/kiln.h"
#include "kiln/runtime/eager_mode.h"
#include "test_kernels.h"

namespace kiln {
namespace {

// Sets an environment variable for the scope and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(EagerMode, Names) {
  EXPECT_EQ(eager_mode_name(EagerMode::DeferNever), "DeferNever");
  EXPECT_EQ(eager_mode_name(EagerMode::DeferNeverLaunchBlocking), "DeferNeverLaunchBlocking");
  EXPECT_EQ(eager_mode_name(EagerMode::DeferAndFuse), "DeferAndFuse");
}

TEST(EagerMode, GuardsNestAndTheInnermostWins) {
  const EagerMode outside = eager_mode();
  {
    EagerModeGuard a(EagerMode::DeferNeverLaunchBlocking);
    EXPECT_EQ(eager_mode(), EagerMode::DeferNeverLaunchBlocking);
    {
      EagerModeGuard b(EagerMode::DeferNever);
      EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
    }
    EXPECT_EQ(eager_mode(), EagerMode::DeferNeverLaunchBlocking);
  }
  EXPECT_EQ(eager_mode(), outside);
}

TEST(EagerMode, GuardsAreLocalToTheirThread) {
  set_eager_mode(EagerMode::DeferNever);
  std::latch guarded(2), checked(2);
  EagerMode seen_by_other = EagerMode::DeferAndFuse, seen_by_other_inner = EagerMode::DeferAndFuse;
  std::thread other([&] {
    guarded.arrive_and_wait();  // the main thread holds its guard now
    seen_by_other = eager_mode();
    EagerModeGuard inner(EagerMode::DeferNeverLaunchBlocking);
    seen_by_other_inner = eager_mode();
    checked.arrive_and_wait();
  });
  {
    EagerModeGuard g(EagerMode::DeferNeverLaunchBlocking);
    guarded.arrive_and_wait();
    {
      EagerModeGuard inner(EagerMode::DeferNever);
      checked.arrive_and_wait();  // the other thread holds its own guard now
      EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
    }
    EXPECT_EQ(eager_mode(), EagerMode::DeferNeverLaunchBlocking);
  }
  other.join();
  EXPECT_EQ(seen_by_other, EagerMode::DeferNever);  // the process mode, not the main thread's guard
  EXPECT_EQ(seen_by_other_inner, EagerMode::DeferNeverLaunchBlocking);
}

TEST(EagerMode, ProcessModeAppliesToThreadsWithoutAGuard) {
  set_eager_mode(EagerMode::DeferNeverLaunchBlocking);
  EagerMode seen = EagerMode::DeferNever;
  std::thread([&] { seen = eager_mode(); }).join();
  EXPECT_EQ(seen, EagerMode::DeferNeverLaunchBlocking);
  {
    EagerModeGuard g(EagerMode::DeferNever);
    EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
  }
  set_eager_mode(EagerMode::DeferNever);
  EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
}

// What DeferAndFuse does with ops is runtime/deferred's business (tests/runtime/deferred_*); here only
// that the process mode and guards select it like any other mode.
TEST(EagerMode, DeferAndFuseIsSelectedLikeTheOthers) {
  set_eager_mode(EagerMode::DeferAndFuse);
  EXPECT_EQ(eager_mode(), EagerMode::DeferAndFuse);
  {
    EagerModeGuard g(EagerMode::DeferNever);
    EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
  }
  EXPECT_EQ(eager_mode(), EagerMode::DeferAndFuse);
  set_eager_mode(EagerMode::DeferNever);
  {
    EagerModeGuard g(EagerMode::DeferAndFuse);
    EXPECT_EQ(eager_mode(), EagerMode::DeferAndFuse);
  }
  EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
}

TEST(EagerMode, EnvironmentDefault) {
  {
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", nullptr), df("KILN_DEFER_AND_FUSE", nullptr);
    EXPECT_EQ(eager_mode_from_environment(), EagerMode::DeferNever);
  }
  {
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", "0"), df("KILN_DEFER_AND_FUSE", "");
    EXPECT_EQ(eager_mode_from_environment(), EagerMode::DeferNever);
  }
  {
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", "1"), df("KILN_DEFER_AND_FUSE", nullptr);
    EXPECT_EQ(eager_mode_from_environment(), EagerMode::DeferNeverLaunchBlocking);
  }
  {
    // Launch-blocking is checked first, as TorchTPU does.
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", "1"), df("KILN_DEFER_AND_FUSE", "1");
    EXPECT_EQ(eager_mode_from_environment(), EagerMode::DeferNeverLaunchBlocking);
  }
  {
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", "0"), df("KILN_DEFER_AND_FUSE", "1");
    EXPECT_EQ(eager_mode_from_environment(), EagerMode::DeferAndFuse);
  }
  {
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", nullptr), df("KILN_DEFER_AND_FUSE", "2");
    const std::string e = error_of([] { (void)eager_mode_from_environment(); });
    EXPECT_NE(e.find("KILN_DEFER_AND_FUSE: expected 0 or 1, got '2'"), std::string::npos) << e;
  }
  {
    ScopedEnv lb("KILN_LAUNCH_BLOCKING", "yes"), df("KILN_DEFER_AND_FUSE", nullptr);
    const std::string e = error_of([] { (void)eager_mode_from_environment(); });
    EXPECT_NE(e.find("KILN_LAUNCH_BLOCKING: expected 0 or 1, got 'yes'"), std::string::npos) << e;
  }
}

// The process default is read from the environment at the first op, in a fresh process.
class EagerModeProcess : public ::testing::Test {
 protected:
  EagerModeProcess() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(EagerModeProcess, DeferAndFuseFromTheEnvironmentIsTheProcessDefault) {
  ScopedEnv lb("KILN_LAUNCH_BLOCKING", nullptr), df("KILN_DEFER_AND_FUSE", "1");
  EXPECT_EXIT(
      {
        if (eager_mode() != EagerMode::DeferAndFuse) std::exit(1);
        int seen_by_other = -1;
        std::thread([&] { seen_by_other = static_cast<int>(eager_mode()); }).join();
        std::exit(seen_by_other == static_cast<int>(EagerMode::DeferAndFuse) ? 7 : 2);
      },
      ::testing::ExitedWithCode(7), "");
}

TEST_F(EagerModeProcess, LaunchBlockingFromTheEnvironmentReportsAtTheCall) {
  ScopedEnv lb("KILN_LAUNCH_BLOCKING", "1"), df("KILN_DEFER_AND_FUSE", nullptr);
  EXPECT_EXIT(
      {
        if (eager_mode() != EagerMode::DeferNeverLaunchBlocking) std::exit(1);
        try {
          runtime_test::run("runtime_test.fail", {}, {Tensor::empty({1})});
        } catch (const Error& e) {
          std::exit(std::string(e.what()).find("runtime_test.fail") != std::string::npos ? 5 : 1);
        }
        std::exit(2);
      },
      ::testing::ExitedWithCode(5), "");
}

}  // namespace
}  // namespace kiln

#include "kiln/core/pending_work.h"

namespace kiln {

namespace {
thread_local HostReadObserver* t_observer = nullptr;
}  // namespace

HostReadObserverScope::HostReadObserverScope(HostReadObserver* observer) : previous_(t_observer) {
  t_observer = observer;
}

HostReadObserverScope::~HostReadObserverScope() {
  t_observer = previous_;
}

HostReadObserver* host_read_observer() {
  return t_observer;
}

}  // namespace kiln

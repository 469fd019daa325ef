#include "worker/dist/communicator.h"

#include <utility>

namespace pstar {

CollectiveTicket Communicator::Start(std::function<Status(Communicator&)> work) {
  const CollectiveTicket ticket = ++started_;
  Status s = work(*this);
  if (!s.ok() && failure_.ok()) {
    failure_ = std::move(s);
    failed_at_ = ticket;
  }
  return ticket;
}

Status Communicator::ReduceScatterHalf(const uint16_t*, uint16_t*, int64_t, HalfFormat) {
  return Status::FailedPrecondition("this communicator has no 16-bit reduce-scatter");
}

int64_t Communicator::waited_nanoseconds() const {
  int64_t ns = 0;
  for (const auto& n : counters_.nanoseconds) ns += n.load();
  return ns;
}

Status Communicator::Wait(CollectiveTicket ticket) {
  if (!failure_.ok() && failed_at_ <= ticket) return failure_;
  return Status();
}

}  // namespace pstar

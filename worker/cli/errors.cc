#include <cstdio>

#include "worker/cli/commands.h"

namespace pstar::cli {

int ReportError(const Status& status) {
  std::fprintf(stderr, "pstar: error: %s\n", status.message().c_str());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kDataLoss:
    case StatusCode::kResourceExhausted:
    case StatusCode::kFailedPrecondition:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "pstar: error: %s\n", message.c_str());
  return kExitBadInput;
}

}  // namespace pstar::cli

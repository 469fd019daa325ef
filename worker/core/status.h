// Status and Result<T>: errors that cross module boundaries. A Status carries a
// code and a one-line message that names the problem for the user.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace pstar {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad config, CLI or API argument
  kNotFound,           // a file or object that should exist does not
  kDataLoss,           // truncated or corrupt data
  kResourceExhausted,  // a memory budget is too small
  kFailedPrecondition, // the request cannot be served in this build or state
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "prefix: message".
  Status WithPrefix(const std::string& prefix) const {
    if (ok()) return *this;
    return Status(code_, prefix + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace pstar

#define PSTAR_CONCAT_INNER(a, b) a##b
#define PSTAR_CONCAT(a, b) PSTAR_CONCAT_INNER(a, b)

#define PSTAR_RETURN_IF_ERROR(expr)               \
  do {                                            \
    ::pstar::Status pstar_status_ = (expr);       \
    if (!pstar_status_.ok()) return pstar_status_; \
  } while (0)

#define PSTAR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define PSTAR_ASSIGN_OR_RETURN(lhs, expr) \
  PSTAR_ASSIGN_OR_RETURN_IMPL(PSTAR_CONCAT(pstar_result_, __LINE__), lhs, expr)

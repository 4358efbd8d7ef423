// Status and StatusOr<T>: the error type returned across vipsd module
// boundaries (in the spirit of leveldb::Status and absl::StatusOr).
//
// No exception crosses a module boundary in vipsd. Functions that can fail
// return a Status (or a StatusOr<T> carrying a value on success). Messages are
// written for operators: they name the parameter, key, record or file that is
// wrong and the allowed range. They must never contain numbers computed from
// private records (see README "Threat model").
//
// Thread-safety: Status and StatusOr are values; distinct objects may be used
// from different threads freely.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace vipsd {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // caller passed a value outside its documented range
  kOutOfRange,        // a computation left its valid domain (e.g. overflow)
  kFailedPrecondition,  // object not in a state that allows the call
  kNotFound,
  kDataLoss,          // persisted state is corrupt or truncated
  kResourceExhausted,  // e.g. privacy budget would be exceeded
  kUnavailable,       // transient: retry with backoff
  kInternal,          // a bug or violated invariant
  kCancelled,         // the operation was abandoned because the caller is stopping
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: --sampling-rate must be in (0, 1]".
  std::string ToString() const;

  bool operator==(const Status& other) const = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status OutOfRangeError(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
inline Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status NotFoundError(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status DataLossError(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
inline Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status UnavailableError(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
inline Status CancelledError(std::string m) {
  return Status(StatusCode::kCancelled, std::move(m));
}
inline Status InternalError(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}

// Holds either a value or a non-OK Status. Accessing value() on an error is a
// programming bug and asserts.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}        // NOLINT: implicit
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT: implicit
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit
    assert(!status_.ok() && "StatusOr constructed from an OK status");
    if (status_.ok()) status_ = InternalError("StatusOr built from OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace vipsd

#define VIPSD_STATUS_CONCAT_INNER_(a, b) a##b
#define VIPSD_STATUS_CONCAT_(a, b) VIPSD_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define VIPSD_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::vipsd::Status vipsd_status_tmp_ = (expr);     \
    if (!vipsd_status_tmp_.ok()) return vipsd_status_tmp_; \
  } while (false)

// `VIPSD_ASSIGN_OR_RETURN(auto x, Foo());` — unwraps a StatusOr or returns its
// error from the enclosing function.
#define VIPSD_ASSIGN_OR_RETURN(lhs, expr) \
  VIPSD_ASSIGN_OR_RETURN_IMPL_(VIPSD_STATUS_CONCAT_(vipsd_statusor_, __LINE__), lhs, expr)
#define VIPSD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

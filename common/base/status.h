// Small status helpers on top of absl::Status. Debian's abseil (20220623) predates
// RETURN_IF_ERROR/ASSIGN_OR_RETURN, so mer keeps its own with the same names and meaning.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MER_STATUS_CONCAT_INNER_(a, b) a##b
#define MER_STATUS_CONCAT_(a, b) MER_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status mer_status_ = (expr);       \
    if (!mer_status_.ok()) return mer_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr());` binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL_(MER_STATUS_CONCAT_(mer_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

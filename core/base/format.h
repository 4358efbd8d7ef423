#ifndef VIPSD_CORE_BASE_FORMAT_H_
#define VIPSD_CORE_BASE_FORMAT_H_

#include <string>
#include <string_view>

namespace vipsd {

// The shortest decimal text that reads back as the same double: "0.9", not
// "0.90000000000000002"; "1e-05" style exponents only where shorter.
// Infinities print as "Infinity"/"-Infinity" and NaN as "NaN" (callers that
// write JSON must not pass them).
std::string ShortestNumber(double value);

// `value` with exactly `digits` decimals ("%.*f"): ε and ρ in log lines.
std::string FixedDecimal(double value, int digits);

// A JSON string literal of `text`: quotes, backslashes and control
// characters escaped (bytes ≥ 0x80 pass unchanged).
std::string JsonString(std::string_view text);

}  // namespace vipsd

#endif  // VIPSD_CORE_BASE_FORMAT_H_

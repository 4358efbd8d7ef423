#ifndef VIPSD_CORE_BASE_FORMAT_H_
#define VIPSD_CORE_BASE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <span>
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

// `value` to `digits` significant digits ("%.*g": 2.76e-07, 1.0276e-05):
// figures a person reads, such as the planner's.
std::string SignificantDigits(double value, int digits);

// The exact text of a double in C99 hexadecimal ("%a": 0x1.8p+0, 0x0p+0),
// the form every state file vipsd writes (ledger, accountants, filter
// weights, slot windows) uses so that a value reads back bit for bit.
// Infinities print as "inf"/"-inf" and NaN as "nan". vipsd never changes
// the C locale, so the radix character is always '.'.
std::string HexDouble(double value);

// What a state file's reader accepts for a number.
enum class NonFinite {
  kReject,         // only finite values
  kAllowInfinity,  // +/-inf too (an RDP curve is +inf at orders it cannot bound); never NaN
};

// Reads `token` whole as a double (the HexDouble form, or any form strtod
// reads) into *out. False when the token is empty, has anything before or
// after the number, is NaN, or is infinite and `non_finite` is kReject;
// *out is then unspecified.
bool ParseHexDouble(const std::string& token, double* out,
                    NonFinite non_finite = NonFinite::kReject);

// Lowercase hexadecimal of `bytes`, two digits per byte ("00ff"): the form
// of every id, key and digest vipsd writes (run ids, fingerprints, public
// keys).
std::string LowerHex(std::span<const uint8_t> bytes);

// Whether `text` is exactly `length` lowercase hexadecimal digits (the
// form LowerHex writes; readers of vipsd's files and messages accept no
// other).
bool IsLowerHex(std::string_view text, size_t length);

// A JSON string literal of `text`: quotes, backslashes and control
// characters escaped (bytes ≥ 0x80 pass unchanged).
std::string JsonString(std::string_view text);

}  // namespace vipsd

#endif  // VIPSD_CORE_BASE_FORMAT_H_

// The unit decoder: a model's RecordDecoder plus the record's privacy unit
// (privacy.unit; docs/privacy_accounting.md "The privacy unit"). It decodes
// the record with the model's decoder, then takes the unit id from
//   kKey:   the Kafka message key (DecodeKeyed's key; non-empty), or
//   kField: the JSON key `field` of the record (a non-empty string, or an
//           integer kept in decimal, as "id" is read),
// and stores its digest (svi::UnitDigest) in model::Record::unit. A record
// whose own decoding fails keeps that reason; then a missing id is
// kMissingUnit and a field of another type kBadUnit.
//
// Privacy: the unit id is private (it says whose record this is); only its
// digest is kept, in the record, behind the privacy wall. Failures carry a
// reason code only.
// Thread-safety: as the wrapped decoder (const, concurrent Decode calls).
#pragma once

#include <memory>
#include <string>

#include "connectors/decode/record_decoder.h"
#include "core/privacy/mechanisms/privacy_unit.h"

namespace vipsd::connectors {

enum class UnitSource { kKey, kField };

// `partitioner` (kKey only): also store the key's partitioner hash in
// model::Record::unit_hash (shared work: the unit's home partition).
std::unique_ptr<RecordDecoder> NewUnitDecoder(
    std::unique_ptr<RecordDecoder> inner, UnitSource source, std::string field = "",
    privacy::UnitPartitioner partitioner = privacy::UnitPartitioner::kNone);

}  // namespace vipsd::connectors

#include "connectors/file/jsonl_source.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace vipsd::connectors {
namespace {

constexpr size_t kReadBufferBytes = size_t{64} << 10;

bool IsBlank(std::string_view line) {
  for (const char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

Rejection MakeRejection(int64_t line_number, RejectReason reason) {
  Rejection rejection;
  rejection.line_number = line_number;
  rejection.reason_code = reason;
  rejection.reason = "line " + std::to_string(line_number) + ": ";
  rejection.reason += RejectReasonName(reason);
  rejection.reason += ": ";
  rejection.reason += RejectReasonDescription(reason);
  return rejection;
}

}  // namespace

JsonlDocumentSource::JsonlDocumentSource(std::string path, const text::Vocabulary* vocabulary,
                                         JsonlSourceOptions options,
                                         UniqueFile file)
    : path_(std::move(path)),
      vocabulary_(vocabulary),
      options_(options),
      file_(std::move(file)),
      buffer_(kReadBufferBytes) {}

StatusOr<JsonlDocumentSource> JsonlDocumentSource::Open(const std::string& path,
                                                        const text::Vocabulary& vocabulary,
                                                        JsonlSourceOptions options) {
  return OpenFile(path, &vocabulary, options);
}

StatusOr<JsonlDocumentSource> JsonlDocumentSource::OpenForRecords(const std::string& path,
                                                                  JsonlSourceOptions options) {
  return OpenFile(path, nullptr, options);
}

StatusOr<JsonlDocumentSource> JsonlDocumentSource::OpenFile(const std::string& path,
                                                            const text::Vocabulary* vocabulary,
                                                            JsonlSourceOptions options) {
  if (options.max_line_bytes < 1) {
    return InvalidArgumentError("JSONL source " + path + ": max_line_bytes must be at least 1");
  }
  // A regular file only (a FIFO or a device would block or never end),
  // opened close-on-exec; its lines are bounded by max_line_bytes.
  auto file = OpenRegularFile(path, kNoSizeBound);
  if (!file.ok()) {
    return Status(file.status().code(), "JSONL source " + std::string(file.status().message()));
  }
  return JsonlDocumentSource(path, vocabulary, options, std::move(*file));
}

StatusOr<JsonlDocumentSource::LineStatus> JsonlDocumentSource::ReadLine() {
  line_.clear();
  bool read_any = false;
  bool too_long = false;
  while (true) {
    if (buffer_begin_ == buffer_end_) {
      if (end_of_file_) break;
      const size_t read = std::fread(buffer_.data(), 1, buffer_.size(), file_.get());
      if (read == 0) {
        if (std::ferror(file_.get())) {
          return UnavailableError("cannot read JSONL source " + path_ + ": " +
                                  std::strerror(errno));
        }
        end_of_file_ = true;
        break;
      }
      buffer_begin_ = 0;
      buffer_end_ = read;
    }
    read_any = true;
    const char* begin = buffer_.data() + buffer_begin_;
    const size_t available = buffer_end_ - buffer_begin_;
    const auto* newline = static_cast<const char*>(std::memchr(begin, '\n', available));
    const size_t chunk = newline == nullptr ? available : static_cast<size_t>(newline - begin);
    if (!too_long) {
      if (line_.size() + chunk > options_.max_line_bytes) {
        too_long = true;
        // Drop what was kept, but keep the capacity (bounded by the limit).
        line_.clear();
      } else {
        line_.append(begin, chunk);
      }
    }
    buffer_begin_ += newline == nullptr ? chunk : chunk + 1;
    if (newline != nullptr) break;
  }
  if (!read_any) return LineStatus::kEndOfFile;
  return too_long ? LineStatus::kTooLong : LineStatus::kLine;
}

StatusOr<std::optional<DecodedLine>> JsonlDocumentSource::Next() {
  if (vocabulary_ == nullptr) {
    return FailedPreconditionError("JSONL source " + path_ + " was opened for records: use NextRecord");
  }
  while (true) {
    VIPSD_ASSIGN_OR_RETURN(const LineStatus status, ReadLine());
    if (status == LineStatus::kEndOfFile) return std::optional<DecodedLine>();
    ++line_number_;
    ++stats_.lines;
    if (status == LineStatus::kTooLong) {
      ++stats_.rejections;
      return std::optional<DecodedLine>(MakeRejection(line_number_, RejectReason::kLineTooLong));
    }
    if (IsBlank(line_)) {
      ++stats_.blank_lines;
      continue;
    }
    DecodeResult result = DecodeJsonDocument(line_, *vocabulary_);
    if (const auto* failure = std::get_if<DecodeFailure>(&result)) {
      ++stats_.rejections;
      return std::optional<DecodedLine>(MakeRejection(line_number_, failure->reason));
    }
    text::Document& document = std::get<text::Document>(result);
    ++stats_.documents;
    if (document.word_ids.empty()) ++stats_.empty_documents;
    return std::optional<DecodedLine>(std::move(document));
  }
}

StatusOr<std::optional<DecodedRecordLine>> JsonlDocumentSource::NextRecord(
    const RecordDecoder& decoder) {
  while (true) {
    VIPSD_ASSIGN_OR_RETURN(const LineStatus status, ReadLine());
    if (status == LineStatus::kEndOfFile) return std::optional<DecodedRecordLine>();
    ++line_number_;
    ++stats_.lines;
    if (status == LineStatus::kTooLong) {
      ++stats_.rejections;
      return std::optional<DecodedRecordLine>(
          MakeRejection(line_number_, RejectReason::kLineTooLong));
    }
    if (IsBlank(line_)) {
      ++stats_.blank_lines;
      continue;
    }
    RecordDecodeResult result = decoder.Decode(line_);
    if (const auto* failure = std::get_if<DecodeFailure>(&result)) {
      ++stats_.rejections;
      return std::optional<DecodedRecordLine>(MakeRejection(line_number_, failure->reason));
    }
    ++stats_.documents;
    return std::optional<DecodedRecordLine>(std::move(std::get<model::Record>(result)));
  }
}

StatusOr<std::optional<RawLine>> JsonlDocumentSource::NextRawLine() {
  while (true) {
    VIPSD_ASSIGN_OR_RETURN(const LineStatus status, ReadLine());
    if (status == LineStatus::kEndOfFile) return std::optional<RawLine>();
    ++line_number_;
    ++stats_.lines;
    RawLine raw;
    raw.line_number = line_number_;
    if (status == LineStatus::kTooLong) {
      raw.too_long = true;
      return std::optional<RawLine>(std::move(raw));
    }
    if (IsBlank(line_)) {
      ++stats_.blank_lines;
      continue;
    }
    raw.bytes = line_;
    return std::optional<RawLine>(std::move(raw));
  }
}

StatusOr<int64_t> JsonlDocumentSource::CountLines(const std::string& path) {
  VIPSD_ASSIGN_OR_RETURN(UniqueFile file, OpenRegularFile(path, kNoSizeBound));
  std::vector<char> buffer(size_t{1} << 16);
  int64_t lines = 0;
  bool pending = false;  // bytes after the last newline
  for (;;) {
    const size_t read = std::fread(buffer.data(), 1, buffer.size(), file.get());
    if (read == 0) break;
    for (size_t i = 0; i < read; ++i) {
      if (buffer[i] == '\n') {
        ++lines;
        pending = false;
      } else {
        pending = true;
      }
    }
  }
  if (std::ferror(file.get())) {
    return UnavailableError("cannot read " + path + ": " + std::strerror(errno));
  }
  return lines + (pending ? 1 : 0);
}

}  // namespace vipsd::connectors

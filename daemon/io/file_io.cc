#include "daemon/io/file_io.h"

#include <filesystem>
#include <optional>
#include <utility>

#include "connectors/file/dead_letter_file.h"
#include "connectors/file/jsonl_source.h"
#include "connectors/file/release_file_sink.h"
#include "core/base/log.h"

namespace vipsd::daemon {
namespace {

class FileInput final : public InputSource {
 public:
  FileInput(connectors::JsonlDocumentSource source, std::string topic, int64_t lines)
      : source_(std::move(source)), topic_(std::move(topic)), lines_(lines) {}

  StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds) override {
    PollBatch batch;
    while (!at_end_ && batch.records.size() < max_records) {
      VIPSD_ASSIGN_OR_RETURN(auto line, source_.NextRawLine());
      if (!line.has_value()) {
        at_end_ = true;
        batch.reached_end[StreamName(topic_, 0)] = lines_;
        break;
      }
      InputRecord record;
      record.topic = topic_;
      record.partition = 0;
      record.offset = line->line_number - 1;
      record.oversize = line->too_long;
      record.payload = std::move(line->bytes);
      read_ = line->line_number;
      batch.records.push_back(std::move(record));
    }
    return batch;
  }

  Status MarkDone(const InputRecord&) override { return Status::Ok(); }
  Status Pause(const std::set<std::string>&) override { return Status::Ok(); }
  Status Resume(const std::set<std::string>&) override { return Status::Ok(); }
  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double) override {
    return std::map<std::string, StreamBounds>{{StreamName(topic_, 0), {0, lines_}}};
  }
  Status Commit() override { return Status::Ok(); }
  int64_t Lag() const override { return at_end_ ? 0 : lines_ - read_; }
  Status Close() override { return Status::Ok(); }

 private:
  connectors::JsonlDocumentSource source_;
  std::string topic_;
  int64_t lines_ = 0;
  int64_t read_ = 0;
  bool at_end_ = false;
};

class FileOutput final : public OutputSink {
 public:
  FileOutput(connectors::ReleaseFileSink releases, connectors::DeadLetterFile dead_letters)
      : releases_(std::move(releases)), dead_letters_(std::move(dead_letters)) {}

  Status PublishRelease(const release::Release& release, const release::EncodedRelease&,
                        double) override {
    return releases_.Write(release);
  }
  Status PublishDeadLetter(const InputRecord& record,
                           connectors::RejectReason reason) override {
    connectors::Rejection rejection;
    rejection.line_number = record.offset + 1;
    rejection.reason_code = reason;
    return dead_letters_.Append(rejection);
  }
  Status PublishAlert(const std::string& json) override {
    Log(LogLevel::kWarning, "offline", "alert: " + json);
    return Status::Ok();
  }
  Status Close() override { return dead_letters_.Sync(); }

 private:
  connectors::ReleaseFileSink releases_;
  connectors::DeadLetterFile dead_letters_;
};

}  // namespace

StatusOr<std::unique_ptr<InputSource>> NewFileInput(const config::VipsdConfig& config) {
  VIPSD_ASSIGN_OR_RETURN(int64_t lines,
                         connectors::JsonlDocumentSource::CountLines(config.source_path));
  VIPSD_ASSIGN_OR_RETURN(auto source,
                         connectors::JsonlDocumentSource::OpenForRecords(config.source_path));
  const std::string topic = std::filesystem::path(config.source_path).filename().string();
  return std::unique_ptr<InputSource>(new FileInput(std::move(source), topic, lines));
}

StatusOr<std::unique_ptr<OutputSink>> NewFileOutput(const config::VipsdConfig& config) {
  VIPSD_ASSIGN_OR_RETURN(auto releases, connectors::ReleaseFileSink::Open(config.sink_directory));
  VIPSD_ASSIGN_OR_RETURN(
      auto dead_letters,
      connectors::DeadLetterFile::Open(
          config.dead_letter_path, std::filesystem::path(config.source_path).filename().string()));
  return std::unique_ptr<OutputSink>(new FileOutput(std::move(releases), std::move(dead_letters)));
}

}  // namespace vipsd::daemon

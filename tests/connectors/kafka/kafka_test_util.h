// Test-only helpers for the Kafka connector tests: client settings that suit
// librdkafka's mock cluster (TOOLCHAIN.md), unique group ids, running kcat and
// python as subprocesses, capturing vipsd::Log, and a raw assign()-based
// reader that sees a topic without a group join (3 s each on the mock).
#pragma once

#include <gtest/gtest.h>
#include <librdkafka/rdkafkacpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/log.h"

namespace vipsd::connectors::testing_kafka {

// Mock-friendly consumer settings (TOOLCHAIN.md): short session so that a
// group id can be reused quickly, fast reconnects after a broker outage.
inline std::map<std::string, std::string> FastConsumerProperties() {
  return {{"session.timeout.ms", "6000"},
          {"heartbeat.interval.ms", "500"},
          {"reconnect.backoff.ms", "50"},
          {"reconnect.backoff.max.ms", "1000"},
          {"topic.metadata.refresh.interval.ms", "1000"},
          {"fetch.wait.max.ms", "100"}};
}

inline std::map<std::string, std::string> FastProducerProperties() {
  return {{"reconnect.backoff.ms", "50"}, {"reconnect.backoff.max.ms", "1000"}, {"linger.ms", "5"}};
}

// A group id no other test (or earlier run) uses.
inline std::string UniqueName(const std::string& prefix) {
  static int counter = 0;
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string name = prefix + "-" + (info != nullptr ? std::string(info->name()) : "x") + "-" +
                     std::to_string(getpid()) + "-" + std::to_string(++counter);
  // Usable as a file name and a Kafka name: [A-Za-z0-9._-].
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  return name;
}

inline std::string TempPath(const std::string& name) {
  return testing::TempDir() + "kafka_" + std::to_string(getpid()) + "_" + name;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `command` with /bin/sh; stderr is merged into stdout unless
// merge_stderr is false (then it goes where the command redirects it).
inline CommandResult RunCommand(const std::string& command, bool merge_stderr = true) {
  CommandResult result;
  FILE* pipe = popen((merge_stderr ? command + " 2>&1" : command).c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Collects every vipsd::Log line while alive (and forwards nothing).
class LogCapture {
 public:
  // Captures every level (debug included) while it lives.
  LogCapture() : previous_level_(MinLogLevel()) {
    SetMinLogLevel(LogLevel::kDebug);
    SetLogSink([this](LogLevel level, std::string_view component, std::string_view message) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(std::string(LogLevelName(level)) + " " + std::string(component) + " " +
                       std::string(message));
    });
  }
  ~LogCapture() {
    SetLogSink(nullptr);
    SetMinLogLevel(previous_level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }
  bool Contains(std::string_view needle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& line : lines_) {
      if (line.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  LogLevel previous_level_;
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

struct RawMessage {
  int32_t partition = 0;
  int64_t offset = 0;
  std::string key;
  std::string value;
  std::vector<std::pair<std::string, std::string>> headers;
};

// Reads every message of `topic` (partitions 0..partitions-1) from the
// beginning up to the current end, with assign() (no group, no join).
inline std::vector<RawMessage> ReadAll(const std::string& bootstrap, const std::string& topic,
                                       int partitions,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::vector<RawMessage> out;
  std::string errstr;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  conf->set("bootstrap.servers", bootstrap, errstr);
  conf->set("group.id", "unused-reader", errstr);
  conf->set("enable.auto.commit", "false", errstr);
  conf->set("enable.partition.eof", "true", errstr);
  conf->set("fetch.message.max.bytes", "1048576", errstr);
  conf->set("log_level", "3", errstr);
  std::unique_ptr<RdKafka::KafkaConsumer> consumer(RdKafka::KafkaConsumer::create(conf.get(), errstr));
  if (consumer == nullptr) {
    ADD_FAILURE() << errstr;
    return out;
  }
  std::vector<RdKafka::TopicPartition*> assignment;
  for (int p = 0; p < partitions; ++p) {
    assignment.push_back(RdKafka::TopicPartition::create(topic, p, RdKafka::Topic::OFFSET_BEGINNING));
  }
  consumer->assign(assignment);
  RdKafka::TopicPartition::destroy(assignment);
  int eofs = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (eofs < partitions && std::chrono::steady_clock::now() < deadline) {
    std::unique_ptr<RdKafka::Message> m(consumer->consume(100));
    if (m->err() == RdKafka::ERR__PARTITION_EOF) {
      ++eofs;
    } else if (m->err() == RdKafka::ERR_NO_ERROR) {
      RawMessage raw;
      raw.partition = m->partition();
      raw.offset = m->offset();
      if (m->key_len() > 0) raw.key.assign(static_cast<const char*>(m->key_pointer()), m->key_len());
      if (m->len() > 0) raw.value.assign(static_cast<const char*>(m->payload()), m->len());
      if (m->headers() != nullptr) {
        for (const RdKafka::Headers::Header& h : m->headers()->get_all()) {
          raw.headers.emplace_back(h.key(), std::string(static_cast<const char*>(h.value()),
                                                        h.value() ? h.value_size() : 0));
        }
      }
      out.push_back(std::move(raw));
    }
  }
  EXPECT_EQ(eofs, partitions) << "reader did not reach the end of " << topic;
  consumer->close();
  return out;
}

// The committed offset of each partition of `topic` for `group` (-1001 if none),
// fetched from the group coordinator without joining the group.
inline std::vector<int64_t> Committed(const std::string& bootstrap, const std::string& group,
                                      const std::string& topic, int partitions) {
  std::vector<int64_t> out(static_cast<size_t>(partitions), RdKafka::Topic::OFFSET_INVALID);
  std::string errstr;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  conf->set("bootstrap.servers", bootstrap, errstr);
  conf->set("group.id", group, errstr);
  conf->set("enable.auto.commit", "false", errstr);
  conf->set("log_level", "3", errstr);
  std::unique_ptr<RdKafka::KafkaConsumer> consumer(RdKafka::KafkaConsumer::create(conf.get(), errstr));
  if (consumer == nullptr) {
    ADD_FAILURE() << errstr;
    return out;
  }
  std::vector<RdKafka::TopicPartition*> list;
  for (int p = 0; p < partitions; ++p) list.push_back(RdKafka::TopicPartition::create(topic, p));
  const RdKafka::ErrorCode err = consumer->committed(list, 10000);
  EXPECT_EQ(err, RdKafka::ERR_NO_ERROR) << RdKafka::err2str(err);
  for (int p = 0; p < partitions; ++p) out[static_cast<size_t>(p)] = list[static_cast<size_t>(p)]->offset();
  RdKafka::TopicPartition::destroy(list);
  consumer->close();
  return out;
}

}  // namespace vipsd::connectors::testing_kafka

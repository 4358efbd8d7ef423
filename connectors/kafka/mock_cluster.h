// MockCluster: an in-process Kafka cluster (librdkafka's built-in mock
// brokers) for the integration tests and for the daemon's embedded demo mode
// (`kafka: {embedded: true}`). It is production code: the demo runs on it.
//
// What it is: N mock brokers (ids 1..N) served by librdkafka threads inside
// this process, listening on 127.0.0.1 with random ports, created on a
// throwaway producer handle that this object owns. Any Kafka client can
// connect to bootstrap_servers() — this process's KafkaSource/KafkaProducer
// and other processes such as kcat.
//
// Limits of librdkafka 2.0.2's mock (TOOLCHAIN.md): it keeps only about
// 5 MiB per partition (an append that evicts every older batch can make new
// data unreadable), so keep each partition well below that; the first group
// join of a consumer costs ~3 s; no Admin API (create topics with
// CreateTopic), no SSL/SASL, no offsets-by-timestamp. Topics that a client
// produces to without creating them first are auto-created by the mock with
// its default partition count; create them explicitly.
//
// Ownership: the cluster lives as long as this object. Destroy every client
// connected to it first (their brokers vanish on destruction; a client left
// behind only logs connection errors until it is destroyed).
// Thread-safety: all methods may be called from any thread (the mock's
// control calls are forwarded to its own thread and wait for the reply).
// Failure: Create returns UNAVAILABLE when librdkafka cannot create the
// handle or the brokers (e.g. no free port); the other calls return
// INVALID_ARGUMENT for bad ids/names and INTERNAL for a mock-side error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/base/status.h"

// Opaque librdkafka C types (keeps <librdkafka/...> out of this header).
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_mock_cluster_s rd_kafka_mock_cluster_t;

namespace vipsd::connectors {

class MockCluster {
 public:
  // 1 <= brokers <= 16.
  static StatusOr<std::unique_ptr<MockCluster>> Create(int brokers);

  MockCluster(const MockCluster&) = delete;
  MockCluster& operator=(const MockCluster&) = delete;
  ~MockCluster();

  // "127.0.0.1:PORT,127.0.0.1:PORT,...": the bootstrap list for clients.
  const std::string& bootstrap_servers() const { return bootstrap_servers_; }
  int broker_count() const { return broker_count_; }

  // Creates `name` with `partitions` partitions (1..1000) and the given
  // replication factor (1..broker_count()). Creating an existing topic is an
  // error (INVALID_ARGUMENT naming the topic).
  Status CreateTopic(const std::string& name, int partitions, int replication_factor = 1);

  // Takes broker `id` (1..broker_count()) down: its client connections are
  // dropped and new ones refused, as when a broker process dies (leadership
  // does not move). SetBrokerUp brings it back with its data.
  Status SetBrokerDown(int32_t id);
  Status SetBrokerUp(int32_t id);

  // The underlying librdkafka mock cluster, for fault injection with
  // <librdkafka/rdkafka_mock.h> (request errors, RTTs) in tests. Owned by
  // this object.
  rd_kafka_mock_cluster_t* mock_handle() const { return cluster_; }

 private:
  MockCluster(rd_kafka_t* handle, rd_kafka_mock_cluster_t* cluster, int broker_count);

  rd_kafka_t* handle_;                 // owned; destroyed after cluster_
  rd_kafka_mock_cluster_t* cluster_;  // owned
  int broker_count_;
  std::string bootstrap_servers_;
};

}  // namespace vipsd::connectors

// Package tests holds kdedup's end-to-end suites: the real worker against a
// Kafka-protocol broker, checked against the exact model of package
// internal/scenario.
//
// The broker is franz-go's kfake, in-process on random ports, by default;
// KDEDUP_TEST_KAFKA=apache runs the suites against one Apache Kafka broker
// started for the package run by internal/kafkatest (Java 17 and Maven);
// a test that needs kfake's fault injection skips there, saying so;
// KDEDUP_TEST_BROKERS=host:port[,...] runs the same suites against a real
// cluster (topics and groups get unique names); KDEDUP_TEST_CONTAINERS=1
// starts a Redpanda container through testcontainers-go, and skips with a
// message saying so when no Docker engine is reachable.
package tests

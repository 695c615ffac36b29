package kafkatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"text/template"
)

// The broker's artifacts. kafka_2.13 declares SLF4J 1.7 and no binding;
// SLF4J 2 with log4j2's binding lets the broker's WARN lines reach the log
// file (without a binding SLF4J drops them all).
const (
	log4jVersion            = "2.24.3"
	slf4jVersion            = "2.0.17"
	dependencyPluginVersion = "3.8.1"
)

var pomTemplate = template.Must(template.New("pom").Parse(`<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by kdedup's internal/kafkatest: resolves the Apache Kafka broker
     and a log4j2 SLF4J binding; ` + "`mvn dependency:copy-dependencies`" + ` copies
     them to libs/. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.github.kdedup.test</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>{{.Kafka}}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{{.Kafka}}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{{.SLF4J}}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>{{.Log4j}}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{{.Log4j}}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{{.Plugin}}</version>
        <configuration>
          <outputDirectory>{{.Out}}</outputDirectory>
          <includeScope>runtime</includeScope>
        </configuration>
      </plugin>
    </plugins>
  </build>
</project>
`))

// cacheDir is where the jars of a Kafka version are kept between runs:
// opts.CacheDir, or kdedup/kafka-<version> under the user's cache directory
// ($XDG_CACHE_HOME, else ~/.cache on Linux).
func cacheDir(opts Options) (string, error) {
	if opts.CacheDir != "" {
		return opts.CacheDir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kafkatest: finding the user's cache directory: %w", err)
	}
	return filepath.Join(base, "kdedup", "kafka-"+opts.version()), nil
}

// Resolve returns the directory holding the jars of Apache Kafka's broker
// at opts.Version (default DefaultVersion), resolving them with Maven on
// first use into the cache directory (see Options.CacheDir) and reusing
// them afterwards. Maven's own repository (~/.m2) is used as usual, so a
// machine that keeps it resolves offline.
//
// Returns ErrNoToolchain when mvn is not on PATH and the jars are not
// cached yet. Safe for concurrent use by several processes: each resolves
// into a directory of its own and the first to finish publishes it.
func Resolve(ctx context.Context, opts Options) (string, error) {
	dir, err := cacheDir(opts)
	if err != nil {
		return "", err
	}
	libs := filepath.Join(dir, "libs")
	marker := filepath.Join(libs, "kafka_2.13-"+opts.version()+".jar")
	if _, err := os.Stat(marker); err == nil {
		return libs, nil
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", fmt.Errorf("%w: Maven (mvn) resolves the broker's jars: %v", ErrNoToolchain, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kafkatest: creating the cache directory %s: %w", dir, err)
	}
	work, err := os.MkdirTemp(dir, "resolve-")
	if err != nil {
		return "", fmt.Errorf("kafkatest: creating a resolution directory in %s: %w", dir, err)
	}
	defer os.RemoveAll(work)
	var pom bytes.Buffer
	if err := pomTemplate.Execute(&pom, map[string]string{
		"Kafka": opts.version(), "SLF4J": slf4jVersion, "Log4j": log4jVersion,
		"Plugin": dependencyPluginVersion, "Out": filepath.Join(work, "libs"),
	}); err != nil {
		return "", fmt.Errorf("kafkatest: writing pom.xml: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "pom.xml"), pom.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("kafkatest: writing pom.xml: %w", err)
	}
	cmd := exec.CommandContext(ctx, mvn, "-B", "-q", "dependency:copy-dependencies")
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("kafkatest: resolving org.apache.kafka:kafka_2.13:%s with %s in %s: %w\n%s",
			opts.version(), cmd, work, err, tail(out, 4096))
	}
	if err := os.Rename(filepath.Join(work, "libs"), libs); err != nil {
		// Another process published the same jars first.
		if _, statErr := os.Stat(marker); statErr == nil {
			return libs, nil
		}
		return "", fmt.Errorf("kafkatest: publishing the resolved jars to %s: %w", libs, err)
	}
	if _, err := os.Stat(marker); err != nil {
		return "", fmt.Errorf("kafkatest: Maven resolved no %s: %w", marker, err)
	}
	return libs, nil
}

// tail returns at most the last n bytes of b, cut at a line start.
func tail(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return b
}

// ErrNoToolchain is returned when Java or Maven, which start and resolve
// the broker, are not installed.
var ErrNoToolchain = errors.New("kafkatest: Java 17 and Maven are needed to run Apache Kafka")

// Package s3test starts an S3-compatible object store on loopback for tests
// and benchmarks: VersityGW (Apache-2.0, github.com/versity/versitygw), an
// S3 gateway over a directory, built once from the Go module proxy and
// cached outside the repository, the way internal/kafkatest resolves
// Apache Kafka from Maven Central.
//
// A Server serves one bucket, "kdedup", under a fresh directory, with
// fixed root credentials that Env exports as the AWS SDK reads them.
package s3test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Version is the VersityGW release the servers run.
const Version = "v1.8.0"

// module is the package `go install` builds.
const module = "github.com/versity/versitygw/cmd/versitygw"

// Bucket is the bucket every Server serves.
const Bucket = "kdedup"

// The root credentials of every Server: test values, valid on loopback
// only.
const (
	AccessKey = "kdedup-test"
	SecretKey = "kdedup-test-secret"
	Region    = "us-east-1"
)

// Env is the environment the AWS SDK reads the Server's credentials from
// (set it on the process that opens the bucket).
func Env() map[string]string {
	return map[string]string{
		"AWS_ACCESS_KEY_ID":     AccessKey,
		"AWS_SECRET_ACCESS_KEY": SecretKey,
		"AWS_REGION":            Region,
	}
}

var buildMu sync.Mutex

// Binary returns the path of the versitygw binary: $KDEDUP_VERSITYGW when
// set, else kdedup/versitygw-<Version>/versitygw under the user's cache
// directory, built there with `go install` (about a minute, 80 MB) the
// first time.
func Binary(ctx context.Context) (string, error) {
	if p := os.Getenv("KDEDUP_VERSITYGW"); p != "" {
		return p, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("s3test: finding the user's cache directory: %w", err)
	}
	dir := filepath.Join(base, "kdedup", "versitygw-"+Version)
	bin := filepath.Join(dir, "versitygw")
	buildMu.Lock()
	defer buildMu.Unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("s3test: %w", err)
	}
	// Built in a scratch GOBIN and renamed, so that an interrupted build
	// leaves no half-written binary behind.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("s3test: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "go", "install", module+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("s3test: building VersityGW %s (go install %s@%s): %w\n%s", Version, module, Version, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "versitygw"), bin); err != nil {
		return "", fmt.Errorf("s3test: %w", err)
	}
	return bin, nil
}

// Server is a running VersityGW.
type Server struct {
	cmd  *exec.Cmd
	addr string
	root string
	log  *os.File
	done chan error
}

// Start runs VersityGW over a bucket directory under root, on a free
// loopback port, and waits until it answers.
func Start(ctx context.Context, root string) (*Server, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(root, "gw", Bucket), 0o755); err != nil {
		return nil, fmt.Errorf("s3test: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("s3test: finding a free port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	log, err := os.Create(filepath.Join(root, "versitygw.log"))
	if err != nil {
		return nil, fmt.Errorf("s3test: %w", err)
	}
	s := &Server{addr: addr, root: root, log: log, done: make(chan error, 1)}
	s.cmd = exec.Command(bin, "--access", AccessKey, "--secret", SecretKey, "--region", Region, "--port", addr, "--quiet",
		"posix", filepath.Join(root, "gw"))
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = sysProcAttr()
	if err := s.cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("s3test: starting %s: %w", bin, err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
			return s, nil
		}
		select {
		case err := <-s.done:
			s.done <- err
			return nil, fmt.Errorf("s3test: VersityGW exited at start-up (%v): %s", err, s.Log())
		case <-ctx.Done():
			s.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("s3test: VersityGW did not answer on %s within 30s: %s", addr, s.Log())
		}
	}
}

// Endpoint is the server's S3 endpoint URL.
func (s *Server) Endpoint() string { return "http://" + s.addr }

// URL is the KDEDUP_SNAPSHOT_URL of prefix in the server's bucket.
func (s *Server) URL(prefix string) string {
	return "s3://" + Bucket + "/" + strings.Trim(prefix, "/") + "?region=" + Region + "&endpoint=" + s.Endpoint() + "&use_path_style=true"
}

// Dir is the directory holding the bucket's objects, one file per object
// key (the posix backend).
func (s *Server) Dir() string { return filepath.Join(s.root, "gw", Bucket) }

// Log returns the server's output so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log.Name())
	return string(b)
}

// Stop kills the server: the store becomes unreachable.
func (s *Server) Stop() {
	_ = s.cmd.Process.Kill()
	<-s.done
	s.done <- errors.New("stopped")
}

// Close stops the server.
func (s *Server) Close() {
	select {
	case err := <-s.done:
		s.done <- err
	default:
		s.Stop()
	}
	s.log.Close()
}

// Enabled reports whether the tests that need an S3-compatible server run:
// KDEDUP_TEST_S3=versitygw (CI sets it). A bare `go test ./...` keeps to
// the file driver and does not build the server.
func Enabled() bool { return os.Getenv("KDEDUP_TEST_S3") == "versitygw" }

// New starts a Server for t under a temporary directory, sets the
// credentials' environment for the test (t.Setenv) and stops the server
// when the test ends. Without KDEDUP_TEST_S3=versitygw it skips t, saying
// so.
func New(t testing.TB) *Server {
	t.Helper()
	if !Enabled() {
		t.Skip("needs an S3-compatible server: set KDEDUP_TEST_S3=versitygw (builds VersityGW " + Version + " once, cached under the user's cache directory)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for k, v := range Env() {
		t.Setenv(k, v)
	}
	return s
}

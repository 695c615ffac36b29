package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kdedup/kdedup/config"
	"github.com/kdedup/kdedup/internal/app"
)

// testPKI is a certificate authority with a server certificate for
// serverName and a client certificate, written as PEM files.
type testPKI struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
	server, client            tls.Certificate
}

const serverName = "kafka.kdedup.test"

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kdedup test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, dns []string, usage x509.ExtKeyUsage) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "kdedup test"}, DNSNames: dns,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return pair, certPEM, keyPEM
	}
	server, _, _ := issue(2, []string{serverName}, x509.ExtKeyUsageServerAuth)
	client, certPEM, keyPEM := issue(3, nil, x509.ExtKeyUsageClientAuth)
	p := testPKI{
		caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "client.pem"), keyFile: filepath.Join(dir, "client.key"),
		pool: x509.NewCertPool(), server: server, client: client,
	}
	p.pool.AddCert(ca)
	for file, data := range map[string][]byte{
		p.caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		p.certFile: certPEM,
		p.keyFile:  keyPEM,
	} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// newSecureBroker starts a kfake cluster that requires mutual TLS and SASL
// (user kdedup with password, by mechanism), and returns it with the
// connection options a client needs.
func newSecureBroker(t *testing.T, pki testPKI, mechanism, password string) *broker {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
		kfake.EnableSASL(), kfake.Superuser(mechanism, "kdedup", password),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg, err := config.LoadFrom(map[string]string{
		"KDEDUP_BROKERS": strings.Join(c.ListenAddrs(), ","), "KDEDUP_INPUT_TOPICS": "unused", "KDEDUP_OUTPUT_TOPIC": "unused2",
		"KDEDUP_TLS_ENABLED": "true", "KDEDUP_TLS_CA_FILE": pki.caFile, "KDEDUP_TLS_CERT_FILE": pki.certFile,
		"KDEDUP_TLS_KEY_FILE": pki.keyFile, "KDEDUP_TLS_SERVER_NAME": serverName,
		"KDEDUP_SASL_MECHANISM": mechanism, "KDEDUP_SASL_USERNAME": "kdedup", "KDEDUP_SASL_PASSWORD": password,
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := app.KafkaOpts(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &broker{addrs: c.ListenAddrs(), prefix: "kdedup-secure-", cluster: c, conn: conn}
}

// TestTLSAndSASL runs the worker against a broker requiring mutual TLS
// (a private CA and a server name other than the address) and SASL
// SCRAM-SHA-512, with the password read from a file as a mounted Secret
// would be: the output equals the exact model.
func TestTLSAndSASL(t *testing.T) {
	pki := newTestPKI(t)
	b := newSecureBroker(t, pki, "SCRAM-SHA-512", "correct horse")
	p := &pipeline{b: b, in: b.name("in"), out: b.name("out"), group: b.name("group"), partitions: 2, delivery: "exactly-once"}
	b.createTopics(t, 2, p.in, p.out)
	passwordFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(passwordFile, []byte("correct horse\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.extraEnv = map[string]string{
		"KDEDUP_TLS_ENABLED": "true", "KDEDUP_TLS_CA_FILE": pki.caFile, "KDEDUP_TLS_CERT_FILE": pki.certFile,
		"KDEDUP_TLS_KEY_FILE": pki.keyFile, "KDEDUP_TLS_SERVER_NAME": serverName,
		"KDEDUP_SASL_MECHANISM": "SCRAM-SHA-512", "KDEDUP_SASL_USERNAME": "kdedup", "KDEDUP_SASL_PASSWORD_FILE": passwordFile,
	}
	recs := stream(11)[:3000]
	p.feed(t, recs, len(recs), 0).wait(t)
	w := p.startWorker(t, t.TempDir())
	want, got := p.output(t, recs)
	w.stop(t)
	requireExact(t, want, got)
}

// TestKafkaAccessRefused: a wrong SASL password, for each mechanism, or a
// CA that did not sign the broker's certificate stops the worker within
// seconds with one error line naming what was refused, instead of retrying;
// the binary exits with code 1, as the README promises.
func TestKafkaAccessRefused(t *testing.T) {
	pki := newTestPKI(t)
	other := newTestPKI(t)
	for _, tc := range []struct {
		name, mechanism string
		env             map[string]string
		want            string
	}{
		{"plain wrong password", "PLAIN", map[string]string{"KDEDUP_SASL_PASSWORD": "wrong"}, `SASL PLAIN authentication as KDEDUP_SASL_USERNAME="kdedup" failed`},
		{"scram-sha-256 wrong password", "SCRAM-SHA-256", map[string]string{"KDEDUP_SASL_PASSWORD": "wrong"}, `SASL SCRAM-SHA-256 authentication as KDEDUP_SASL_USERNAME="kdedup" failed`},
		{"scram-sha-512 wrong user", "SCRAM-SHA-512", map[string]string{"KDEDUP_SASL_USERNAME": "nobody"}, `SASL SCRAM-SHA-512 authentication as KDEDUP_SASL_USERNAME="nobody" failed`},
		{"untrusted broker certificate", "SCRAM-SHA-256", map[string]string{"KDEDUP_TLS_CA_FILE": other.caFile}, "TLS handshake with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newSecureBroker(t, pki, tc.mechanism, "right")
			env := map[string]string{
				"KDEDUP_BROKERS": strings.Join(b.addrs, ","), "KDEDUP_INPUT_TOPICS": "in", "KDEDUP_OUTPUT_TOPIC": "out",
				"KDEDUP_DATA_DIR": t.TempDir(), "KDEDUP_HTTP_ADDR": "127.0.0.1:0",
				"KDEDUP_TLS_ENABLED": "true", "KDEDUP_TLS_CA_FILE": pki.caFile, "KDEDUP_TLS_CERT_FILE": pki.certFile,
				"KDEDUP_TLS_KEY_FILE": pki.keyFile, "KDEDUP_TLS_SERVER_NAME": serverName,
				"KDEDUP_SASL_MECHANISM": tc.mechanism, "KDEDUP_SASL_USERNAME": "kdedup", "KDEDUP_SASL_PASSWORD": "right",
			}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg, err := config.LoadFrom(env)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = app.Run(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
			if !errors.Is(err, app.ErrKafkaAccess) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Run: %v; want one line wrapping ErrKafkaAccess and containing %q", err, tc.want)
			}
			if errors.Is(err, app.ErrConfig) {
				t.Fatalf("Run: %v wraps ErrConfig: the binary would exit 2, a configuration error, instead of 1", err)
			}
			if strings.Contains(err.Error(), "right") || strings.Contains(err.Error(), "wrong") {
				t.Fatalf("the error shows a password: %v", err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("Run took %s to give up", d)
			}
			t.Logf("%s after %s", err, time.Since(start).Round(time.Millisecond))
			if tc.mechanism == "PLAIN" {
				requireBinaryFails(t, env, 1, tc.want)
			}
		})
	}
}

// requireBinaryFails runs kdedup run with exactly env and checks that it
// exits with code and that its last line is a JSON log line at ERROR level
// whose err contains want.
func requireBinaryFails(t *testing.T, env map[string]string, code int, want string) {
	t.Helper()
	cmd := exec.Command(binary, "run")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "KDEDUP_LOG_FORMAT=json")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != code {
		t.Fatalf("kdedup run: %v, want exit code %d; output:\n%s", err, code, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var last struct{ Level, Msg, Err string }
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Level != "ERROR" || !strings.Contains(last.Err, want) {
		t.Fatalf("last output line %q: want a JSON log line at ERROR whose err contains %q (%v)", lines[len(lines)-1], want, err)
	}
}

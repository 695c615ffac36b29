package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kdedup/kdedup/config"
)

// ErrKafkaAccess is returned (wrapped) by Run when the brokers refuse the
// worker's credentials or its TLS handshake: retrying cannot help, so the
// worker stops at once with one error instead of retrying forever.
var ErrKafkaAccess = errors.New("kafka refused the connection")

// KafkaOpts are the connection options of every Kafka client of a worker:
// TLS (KDEDUP_TLS_*) and SASL (KDEDUP_SASL_*). Files are read now; a file
// that cannot be read or parsed returns an error wrapping ErrConfig that
// names the variable.
func KafkaOpts(cfg config.Config) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if cfg.TLSEnabled {
		tc, err := tlsConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if m := saslMechanism(cfg); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func tlsConfig(cfg config.Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName}
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s%s=%s: %v", config.Prefix, "TLS_CA_FILE", cfg.TLSCAFile, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s%s=%s: no PEM certificate in the file", config.Prefix, "TLS_CA_FILE", cfg.TLSCAFile)
		}
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%sTLS_CERT_FILE=%s, %sTLS_KEY_FILE=%s: %v", config.Prefix, cfg.TLSCertFile, config.Prefix, cfg.TLSKeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func saslMechanism(cfg config.Config) sasl.Mechanism {
	user, pass := cfg.SASLUsername, cfg.SASLSecret()
	switch cfg.SASLMechanismName() {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pass}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
	}
	return nil
}

// checkKafkaAccess connects to the brokers once with opts and returns an
// error wrapping ErrKafkaAccess when they refuse the credentials or the
// TLS handshake fails. Other errors (brokers not up yet) are left to the
// client's retries: it returns nil for them. It does nothing without TLS or
// SASL.
func checkKafkaAccess(ctx context.Context, cfg config.Config, opts []kgo.Opt) error {
	if len(opts) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.RequestRetries(0)}, opts...)...)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err = cl.Ping(ctx)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.UnsupportedSaslMechanism):
			return saslRefused(cfg, err.Error())
		case isTLSError(err):
			return fmt.Errorf("%w: TLS handshake with %s: %v", ErrKafkaAccess, strings.Join(cfg.Brokers, ","), err)
		case cfg.SASLMechanismName() != "" && errors.Is(err, io.EOF) && attempt < 3:
			// A broker that closes the connection during SASL instead of
			// answering with an error code (Kafka before 1.0, kfake): ask
			// again, in case it was only restarting.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		case cfg.SASLMechanismName() != "" && errors.Is(err, io.EOF):
			return saslRefused(cfg, "the brokers closed the connection during authentication, three times")
		}
		return nil
	}
}

func saslRefused(cfg config.Config, why string) error {
	return fmt.Errorf("%w: SASL %s authentication as %sSASL_USERNAME=%q failed (check the user, the password and %sSASL_MECHANISM): %s",
		ErrKafkaAccess, cfg.SASLMechanismName(), config.Prefix, cfg.SASLUsername, config.Prefix, why)
}

func isTLSError(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		recordHeader     tls.RecordHeaderError
		alert            tls.AlertError
		verify           *tls.CertificateVerificationError
	)
	var op *net.OpError
	return errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &recordHeader) || errors.As(err, &alert) || errors.As(err, &verify) ||
		(errors.As(err, &op) && strings.Contains(op.Error(), "tls:"))
}

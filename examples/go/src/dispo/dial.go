package dispo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// An Option sets how Dial connects: the token, the transport security.
type Option func(*settings) error

type settings struct {
	token string
	tls   *tls.Config // nil: plaintext
}

// WithToken sends token as "authorization: Bearer <token>" on every call.
func WithToken(token string) Option {
	return func(s *settings) error {
		s.token = token
		return nil
	}
}

// WithTLS speaks TLS, verifying the servers against the CA certificates (PEM) of caFile.
// certFile and keyFile, when not empty, are the certificate and key presented to a server
// that asks for one (mTLS).
func WithTLS(caFile, certFile, keyFile string) Option {
	return func(s *settings) error {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return fmt.Errorf("the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("the CA file %s holds no PEM certificate", caFile)
		}
		config := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if certFile != "" || keyFile != "" {
			pair, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return fmt.Errorf("the client certificate: %w", err)
			}
			config.Certificates = []tls.Certificate{pair}
		}
		s.tls = config
		return nil
	}
}

// WithTLSConfig speaks TLS with config as it is.
func WithTLSConfig(config *tls.Config) Option {
	return func(s *settings) error {
		s.tls = config
		return nil
	}
}

// FromEnvironment reads the settings Dispo's own clients read: DISPO_TOKEN, and TLS when
// DISPO_TLS_CA_FILE is set (with DISPO_TLS_CLIENT_CERT_FILE and DISPO_TLS_CLIENT_KEY_FILE
// for mTLS). Options given after it override it.
func FromEnvironment() Option {
	return func(s *settings) error {
		if token := os.Getenv("DISPO_TOKEN"); token != "" {
			s.token = token
		}
		if ca := os.Getenv("DISPO_TLS_CA_FILE"); ca != "" {
			return WithTLS(ca, os.Getenv("DISPO_TLS_CLIENT_CERT_FILE"), os.Getenv("DISPO_TLS_CLIENT_KEY_FILE"))(s)
		}
		return nil
	}
}

// Dial opens a channel to one of Dispo's services at address ("host:port"). It does not
// wait for the connection: a server that cannot be reached makes the first call
// UNAVAILABLE. Close the connection when done.
func Dial(address string, opts ...Option) (*grpc.ClientConn, error) {
	var s settings
	for _, opt := range opts {
		if err := opt(&s); err != nil {
			return nil, err
		}
	}
	dial := []grpc.DialOption{}
	if s.tls != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(s.tls)))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	if s.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: s.token, secure: s.tls != nil}))
	}
	return grpc.Dial(address, dial...)
}

// bearer is the token as per-call credentials. On a plaintext channel it is sent too, as
// `dispo up` serves plaintext on loopback by default.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

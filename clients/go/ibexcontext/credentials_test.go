package ibexcontext

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testCA issues real certificates for a TLS server and client on loopback.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ibex test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTLSAndABearerToken(t *testing.T) {
	ca := newTestCA(t)
	serverCert := ca.issue(t, "ibex-context", x509.ExtKeyUsageServerAuth)
	clientCert := ca.issue(t, "llm-proxy", x509.ExtKeyUsageClientAuth)
	tlsServer := &tls.Config{Certificates: []tls.Certificate{serverCert}}
	mtlsServer := &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.pool, ClientAuth: tls.RequireAndVerifyClientCert}
	trusting := &tls.Config{RootCAs: ca.pool, ServerName: "ibex-context"}
	withCert := &tls.Config{RootCAs: ca.pool, ServerName: "ibex-context", Certificates: []tls.Certificate{clientCert}}
	failing := TokenSource(func(context.Context) (string, error) { return "", errors.New("token file unreadable") })

	tests := []struct {
		name       string
		server     *tls.Config
		opts       []Option
		wantReason string // empty: answered
		wantAuth   string
	}{
		{name: "TLS", server: tlsServer, opts: []Option{WithTLS(trusting)}},
		{name: "TLS and a token", server: tlsServer, opts: []Option{WithTLS(trusting), WithBearerToken(StaticToken("s3cret"))}, wantAuth: "Bearer s3cret"},
		{name: "mutual TLS and a token", server: mtlsServer, opts: []Option{WithTLS(withCert), WithBearerToken(StaticToken("s3cret"))}, wantAuth: "Bearer s3cret"},
		{name: "mutual TLS without a client certificate", server: mtlsServer, opts: []Option{WithTLS(trusting)}, wantReason: ReasonUnavailable},
		{name: "an untrusted server", server: tlsServer, opts: []Option{WithTLS(&tls.Config{ServerName: "ibex-context"})}, wantReason: ReasonUnavailable},
		{name: "plaintext to a TLS server", server: tlsServer, wantReason: ReasonUnavailable},
		{name: "a token source that fails", server: tlsServer, opts: []Option{WithTLS(trusting), WithBearerToken(failing)}, wantReason: "client_error:UNAUTHENTICATED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			service, target := startScripted(t, grpc.Creds(credentials.NewTLS(tt.server)))
			client := newTestClient(t, target, append(tt.opts, WithTimeout(generous))...)
			original := userMessages("hi")

			result := client.Assemble(context.Background(), Request{Model: modelFull, Messages: original})

			if tt.wantReason != "" {
				if result.FallbackReason != tt.wantReason {
					t.Errorf("FallbackReason = %q (%v), want %q", result.FallbackReason, result.Err, tt.wantReason)
				}
				assertOriginal(t, result, original)
				return
			}
			if !result.FromService {
				t.Fatalf("fell back: %s (%v)", result.FallbackReason, result.Err)
			}
			got := service.lastCall(t).metadata.Get("authorization")
			if tt.wantAuth == "" && len(got) != 0 || tt.wantAuth != "" && (len(got) != 1 || got[0] != tt.wantAuth) {
				t.Errorf("authorization metadata = %v, want %q", got, tt.wantAuth)
			}
		})
	}
}

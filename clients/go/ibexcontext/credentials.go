package ibexcontext

import (
	"context"

	"google.golang.org/grpc/credentials"
)

// TokenSource returns the bearer token for one call, e.g. re-read from a
// projected service-account token file.
type TokenSource func(ctx context.Context) (string, error)

// StaticToken is a TokenSource that always returns token.
func StaticToken(token string) TokenSource {
	return func(context.Context) (string, error) { return token, nil }
}

// bearerToken is the per-call credential of WithBearerToken.
type bearerToken struct {
	source TokenSource
}

var _ credentials.PerRPCCredentials = bearerToken{}

func (b bearerToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	token, err := b.source(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

// RequireTransportSecurity keeps the token off plaintext connections.
func (bearerToken) RequireTransportSecurity() bool { return true }

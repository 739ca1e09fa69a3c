module github.com/ibex-context/ibex-context/clients/go

// The oldest versions it is built and tested with (Debian bookworm's, offline in
// CI); newer ones work too: `go get` picks them for you.
go 1.19

require (
	go.opentelemetry.io/otel v1.1.0
	go.opentelemetry.io/otel/sdk v1.1.0
	go.opentelemetry.io/otel/trace v1.1.0
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)

// The code generators of ../contextv1, pinned (scripts/codegen-go builds them from
// here). A module of its own so that the client's users never see them; keep
// google.golang.org/protobuf at the client module's version.
module github.com/ibex-context/ibex-context/clients/go/tools

go 1.26.0

tool (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)

require (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

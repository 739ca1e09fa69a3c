"""gRPC server reflection (``grpc.reflection.v1`` and ``v1alpha``) as grpc.aio handlers.

What grpcurl and grpc_cli ask: the services served, and the file descriptors of a
file or a symbol (with their dependencies resolved by the client, one request each),
from protobuf's default descriptor pool, where every generated module registers
itself. Written here rather than grpcio-reflection's servicer, which serves v1alpha
only and cannot find the file of a method's symbol in upb's pool (``_symbol_file``).
The messages are grpcio-reflection's ``v1alpha`` ones for both versions: v1 is the same
messages with the same field numbers under a new package name, so the bytes on the
wire are the same (that package does not ship v1's descriptors).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import ModuleType
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

from ibex_context.server.rpc import Method, stream_stream

__all__ = ["reflection_methods"]

_VERSIONS: tuple[tuple[str, ModuleType], ...] = (
    ("grpc.reflection.v1.ServerReflection", v1alpha),
    ("grpc.reflection.v1alpha.ServerReflection", v1alpha),
)


def reflection_methods(services: Sequence[str]) -> list[Method]:
    """``ServerReflectionInfo`` of both reflection versions, listing ``services`` and themselves."""
    listed = [*services, *(name for name, _ in _VERSIONS)]
    methods = []
    for name, messages in _VERSIONS:
        answer = _Reflection(messages, listed)
        methods.append(
            stream_stream(f"/{name}/ServerReflectionInfo", messages.ServerReflectionRequest, answer.info)
        )
    return methods


class _Reflection:
    def __init__(self, messages: ModuleType, services: Sequence[str]) -> None:
        self._pb = messages
        self._services = services
        self._pool = descriptor_pool.Default()

    async def info(self, requests: AsyncIterator[Any], _context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            yield self.answer(request)

    def answer(self, request: Any) -> Any:
        pb = self._pb
        try:
            kind = request.WhichOneof("message_request")
            if kind == "file_by_filename":
                return self._file(self._pool.FindFileByName(request.file_by_filename))
            if kind == "file_containing_symbol":
                return self._file(self._symbol_file(request.file_containing_symbol))
            if kind == "file_containing_extension":
                wanted = request.file_containing_extension
                message = self._pool.FindMessageTypeByName(wanted.containing_type)
                extension = self._pool.FindExtensionByNumber(message, wanted.extension_number)
                return self._file(self._pool.FindFileContainingSymbol(extension.full_name))
            if kind == "all_extension_numbers_of_type":
                message = self._pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = [e.number for e in self._pool.FindAllExtensions(message)]
                return pb.ServerReflectionResponse(
                    all_extension_numbers_response=pb.ExtensionNumberResponse(
                        base_type_name=message.full_name, extension_number=numbers
                    )
                )
            if kind == "list_services":
                return pb.ServerReflectionResponse(
                    list_services_response=pb.ListServiceResponse(
                        service=[pb.ServiceResponse(name=name) for name in self._services]
                    )
                )
        except KeyError:
            return self._error(grpc.StatusCode.NOT_FOUND, "not found")
        return self._error(grpc.StatusCode.INVALID_ARGUMENT, "invalid argument")

    def _symbol_file(self, symbol: str) -> FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            # upb's pool does not index methods ("pkg.Service.Method", which grpcurl's
            # describe sends): the file of the service that has the method.
            service_name, _, method = symbol.rpartition(".")
            service = self._pool.FindServiceByName(service_name)
            if method not in service.methods_by_name:
                raise
            return service.file

    def _file(self, file: FileDescriptor) -> Any:
        proto = FileDescriptorProto()
        file.CopyToProto(proto)
        return self._pb.ServerReflectionResponse(
            file_descriptor_response=self._pb.FileDescriptorResponse(
                file_descriptor_proto=[proto.SerializeToString()]
            )
        )

    def _error(self, code: grpc.StatusCode, message: str) -> Any:
        return self._pb.ServerReflectionResponse(
            error_response=self._pb.ErrorResponse(error_code=code.value[0], error_message=message)
        )

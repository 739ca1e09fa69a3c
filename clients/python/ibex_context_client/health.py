"""The messages of gRPC's health protocol (grpc.health.v1), for ``ContextClient.check_health``.

grpcio-health-checking ships them with its server side; the client needs two messages,
so it builds them here from their descriptor, in a pool of its own (a process that also
imports grpc_health, e.g. the service, keeps its own copy without a clash).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

__all__ = ["HEALTH_CHECK", "HealthCheckRequest", "HealthCheckResponse", "check_request", "serving_status"]

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_PACKAGE = "grpc.health.v1"
# The ServingStatus values of grpc/health/v1/health.proto.
_STATUSES = {"UNKNOWN": 0, "SERVING": 1, "NOT_SERVING": 2, "SERVICE_UNKNOWN": 3}


def _health_file() -> descriptor_pb2.FileDescriptorProto:
    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="grpc/health/v1/health.proto", package=_PACKAGE, syntax="proto3"
    )
    request = file.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = file.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in _STATUSES.items():
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=field.TYPE_ENUM,
        type_name=f".{_PACKAGE}.HealthCheckResponse.ServingStatus",
        label=field.LABEL_OPTIONAL,
    )
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.AddSerializedFile(_health_file().SerializeToString())
HealthCheckRequest: type[message.Message] = message_factory.GetMessageClass(
    _pool.FindMessageTypeByName(f"{_PACKAGE}.HealthCheckRequest")
)
HealthCheckResponse: type[message.Message] = message_factory.GetMessageClass(
    _pool.FindMessageTypeByName(f"{_PACKAGE}.HealthCheckResponse")
)
_STATUS_NAMES = {number: name for name, number in _STATUSES.items()}


def check_request(service: str) -> message.Message:
    """A Check request for ``service`` ('' = the server overall)."""
    request = HealthCheckRequest()
    setattr(request, "service", service)  # noqa: B010 - a dynamic message has no typed fields
    return request


def serving_status(reply: message.Message) -> str:
    """The reply's status by name, e.g. ``SERVING``."""
    number = int(getattr(reply, "status"))  # noqa: B009 - a dynamic message has no typed fields
    return _STATUS_NAMES.get(number, str(number))

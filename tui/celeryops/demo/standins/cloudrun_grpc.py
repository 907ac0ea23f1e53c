"""The gRPC surface of the Cloud Run stand-in: one generic handler per API service (Services, WorkerPools,
Revisions, Operations), each method deserializing the request, calling the stand-in, and answering its refusal or a
fault set for that RPC as the RPC's status."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.cloud import run_v2
from google.iam.v1 import iam_policy_pb2
from google.longrunning import operations_pb2
from grpc_status import rpc_status

from celeryops.demo.standins.cloudrun_model import Refusal

if TYPE_CHECKING:
    from celeryops.demo.standins.cloudrun import CloudRunStandIn

__all__ = ["grpc_handlers"]


def grpc_handlers(api: CloudRunStandIn) -> tuple[grpc.GenericRpcHandler, ...]:
    """The gRPC method handlers of the four API services the stand-in serves, each calling ``api``: a fault set for
    the RPC answers first, a :class:`Refusal` becomes the RPC's status."""
    def wrap(rpc: str, fn: Callable[[Any], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            fault = api.fault_for(rpc)
            if fault is not None:
                context.abort_with_status(rpc_status.to_status(fault.status()))
            try:
                return fn(request)
            except Refusal as exc:
                _abort(context, exc)
        return handler

    def unary(fn: Callable[[Any], Any], request_type: Any, serialize: Callable[[Any], bytes]) -> Any:
        return (fn, request_type, serialize)

    def service(name: str, methods: dict[str, Any]) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(name, {
            rpc: grpc.unary_unary_rpc_method_handler(wrap(rpc, fn), request_deserializer=request_type,
                                                     response_serializer=serialize)
            for rpc, (fn, request_type, serialize) in methods.items()})

    def pb(message: Any) -> bytes:
        return bytes(message.SerializeToString())

    iam_request = iam_policy_pb2.TestIamPermissionsRequest.FromString
    return (
        service("google.cloud.run.v2.Services", {
            "GetService": unary(api.get_service, run_v2.GetServiceRequest.deserialize, run_v2.Service.serialize),
            "UpdateService": unary(api.update_service, run_v2.UpdateServiceRequest.deserialize, pb),
            "TestIamPermissions": unary(lambda r: api.test_iam_permissions(r, True), iam_request, pb),
        }),
        service("google.cloud.run.v2.WorkerPools", {
            "GetWorkerPool": unary(api.get_worker_pool, run_v2.GetWorkerPoolRequest.deserialize,
                                   run_v2.WorkerPool.serialize),
            "UpdateWorkerPool": unary(api.update_worker_pool, run_v2.UpdateWorkerPoolRequest.deserialize, pb),
            "TestIamPermissions": unary(lambda r: api.test_iam_permissions(r, False), iam_request, pb),
        }),
        service("google.cloud.run.v2.Revisions", {
            "GetRevision": unary(api.get_revision, run_v2.GetRevisionRequest.deserialize, run_v2.Revision.serialize),
            "ListRevisions": unary(api.list_revisions, run_v2.ListRevisionsRequest.deserialize,
                                   run_v2.ListRevisionsResponse.serialize),
        }),
        service("google.longrunning.Operations", {
            "GetOperation": unary(api.get_operation, operations_pb2.GetOperationRequest.FromString, pb),
        }),
    )


def _abort(context: grpc.ServicerContext, exc: Refusal) -> NoReturn:
    context.abort(exc.code, exc.message)
    raise AssertionError("unreachable")  # context.abort raises


"""A small stand-in for Triton's KServe v2 endpoints (HTTP/REST and gRPC) on loopback, for tests.

It is *not* Triton: it implements just enough of the KServe v2 protocol for tritonclient's ``infer`` to work
(``/v2/health/ready``, ``/v2/models/{m}[/versions/{v}]/infer`` with JSON and binary tensor data;
gRPC ``ServerReady`` and ``ModelInfer`` through tritonclient's own generated servicer), echoes every input
back as ``OUTPUT<i>``, and records the headers / metadata of every request it receives, which is what a
trace-propagation test needs to see. Model ``missing`` answers like Triton for an unknown model
(HTTP 400 with an ``error`` body, gRPC ``NOT_FOUND``).

    with HttpStandIn() as http_server, GrpcStandIn() as grpc_server:
        tritonclient.http.InferenceServerClient(http_server.url) ...
        http_server.received[-1]["traceparent"]
"""

from __future__ import annotations

import json
import re
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MISSING_MODEL = "missing"
_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
_DTYPE_SIZES = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "INT32": 4, "UINT32": 4,
                "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, path: str) -> None:
        entry = {k.lower(): v for k, v in self.headers.items()}
        entry[":path"] = path
        with self.server.lock:
            self.server.received.append(entry)

    def do_GET(self) -> None:  # noqa: N802
        self._record(self.path)
        if self.path in ("/v2/health/ready", "/v2/health/live"):
            self._send(200, {})
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self._record(self.path)
        match = _INFER_PATH.match(self.path.split("?", 1)[0])
        if match is None:
            self._send(404, {"error": f"no route {self.path}"})
            return
        model = match.group(1)
        if model == MISSING_MODEL:
            self._send(400, {"error": f"Request for unknown model: '{model}' is not found"})
            return
        header_len = self.headers.get("Inference-Header-Content-Length")
        json_part = body[: int(header_len)] if header_len else body
        binary = body[int(header_len):] if header_len else b""
        try:
            request = json.loads(json_part)
            outputs, offset = [], 0
            for i, tensor in enumerate(request.get("inputs", [])):
                size = (tensor.get("parameters") or {}).get("binary_data_size")
                if size is not None:
                    data = _decode(binary[offset: offset + size], tensor["datatype"])
                    offset += size
                else:
                    data = tensor.get("data", [])
                outputs.append({"name": f"OUTPUT{i}", "datatype": tensor["datatype"], "shape": tensor["shape"],
                                "data": _flatten(data)})
        except (ValueError, KeyError, TypeError) as exc:
            self._send(400, {"error": f"bad inference request: {exc}"})
            return
        response = {"model_name": model, "model_version": match.group(2) or "1", "outputs": outputs}
        if request.get("id"):
            response["id"] = request["id"]
        self._send(200, response)


def _decode(raw: bytes, datatype: str) -> list:
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    return np.frombuffer(raw, dtype=triton_to_np_dtype(datatype)).tolist()


def _flatten(data: Any) -> list:
    if isinstance(data, list):
        out: list = []
        for item in data:
            out.extend(_flatten(item))
        return out
    return [data]


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.received: list[dict[str, str]] = []
        self.lock = threading.Lock()


class HttpStandIn:
    """KServe v2 HTTP/REST on 127.0.0.1 (a free port); ``url`` is ``host:port`` as tritonclient wants it."""

    def __init__(self) -> None:
        self._server = _HttpServer(("127.0.0.1", 0))
        self.port = self._server.server_address[1]
        self.url = f"127.0.0.1:{self.port}"
        self.received = self._server.received
        self._thread = threading.Thread(target=self._server.serve_forever, name="kserve-http", daemon=True)

    def __enter__(self) -> HttpStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class GrpcStandIn:
    """KServe v2 gRPC (tritonclient's generated ``GRPCInferenceServiceServicer``) on 127.0.0.1."""

    def __init__(self) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.received: list[dict[str, str]] = []
        lock = threading.Lock()
        received = self.received

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
            def _record(self, context: Any, method: str) -> None:
                entry = {k.lower(): v for k, v in context.invocation_metadata()}
                entry[":method"] = method
                with lock:
                    received.append(entry)

            def ServerReady(self, request, context):  # noqa: N802 - the generated interface
                self._record(context, "ServerReady")
                return service_pb2.ServerReadyResponse(ready=True)

            def ModelInfer(self, request, context):  # noqa: N802
                self._record(context, "ModelInfer")
                if request.model_name == MISSING_MODEL:
                    context.abort(grpc.StatusCode.NOT_FOUND,
                                  f"Request for unknown model: '{request.model_name}' is not found")
                response = service_pb2.ModelInferResponse(model_name=request.model_name,
                                                          model_version=request.model_version or "1",
                                                          id=request.id)
                for i, tensor in enumerate(request.inputs):
                    out = response.outputs.add()
                    out.name, out.datatype = f"OUTPUT{i}", tensor.datatype
                    out.shape.extend(tensor.shape)
                response.raw_output_contents.extend(request.raw_input_contents)
                return response

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.url = f"127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcStandIn:
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop(grace=None).wait(5)

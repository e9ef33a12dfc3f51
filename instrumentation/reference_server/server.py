"""The HTTP front: OpenAI-like ``POST /v1/completions`` (streamed as server-sent events or whole), ``GET
/v1/models``, ``GET /health``. W3C trace context is read from the request headers and the request's own
``traceparent`` is returned in the response headers."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infersight.instrumentation import Instrumentation
from infersight.instrumentation.reference_server.engine import Engine, Job


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=400)


def _parse(body: Any) -> tuple[dict, str | None]:
    if not isinstance(body, dict):
        return {}, "the body must be a JSON object"
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return {}, "prompt must be a string"
    max_tokens = body.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 <= max_tokens <= 4096:
        return {}, "max_tokens must be an integer in [0, 4096]"
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        return {}, "temperature must be a number >= 0"
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return {}, "seed must be an integer"
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": float(temperature), "seed": seed,
            "stream": bool(body.get("stream", False))}, None


def create_app(engine: Engine) -> Starlette:
    inst: Instrumentation = engine.inst

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _bad_request("the body is not valid JSON")
        params, problem = _parse(body)
        if problem:
            return _bad_request(problem)
        model = body.get("model") or engine.model_name
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict] = asyncio.Queue()
        req = inst.request(model, operation="text_completion", headers=dict(request.headers)).start()
        completion_id = f"cmpl-{uuid.uuid4().hex[:16]}"
        req.response(model=engine.model_name, response_id=completion_id)
        job = Job(req, params["prompt"], params["max_tokens"], params["temperature"], params["seed"],
                  emit=lambda item: loop.call_soon_threadsafe(events.put_nowait, item))
        engine.submit(job)
        headers = req.inject({})
        created = int(time.time())

        def chunk(text: str, finish: str | None, usage: dict | None = None) -> dict:
            out = {"id": completion_id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
            if usage is not None:
                out["usage"] = usage
            return out

        def usage_of(item: dict) -> dict:
            p, c = item.get("prompt_tokens", 0), item.get("completion_tokens", 0)
            return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

        if not params["stream"]:
            text = []
            while True:
                item = await events.get()
                if "token" in item:
                    text.append(item["token"])
                else:
                    status = 500 if item["finish"] == "error" else 200
                    return JSONResponse(chunk("".join(text), item["finish"], usage_of(item)), status_code=status,
                                        headers=headers)

        async def stream():
            try:
                while True:
                    item = await events.get()
                    if "token" in item:
                        yield f"data: {json.dumps(chunk(item['token'], None))}\n\n"
                    else:
                        yield f"data: {json.dumps(chunk('', item['finish'], usage_of(item)))}\n\n"
                        yield "data: [DONE]\n\n"
                        return
            finally:
                job.cancelled.set()  # the client went away: the engine stops at the next token

        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": engine.model_name, "object": "model",
                                                         "owned_by": "infersight"}]})

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/models", models), Route("/health", health)])
